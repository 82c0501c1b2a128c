"""Settings: environment (``MEDALLION_*``, nested with ``__``), an optional ``.env`` and an optional
YAML/TOML/JSON config file named by ``MEDALLION_CONFIG``.

Precedence, highest first: explicit overrides (CLI flags), environment, ``.env``, config file, defaults.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as _PydanticSettingsError

from bronze.primitives import StrList
from pipelines.config.sections import (
    CONFIG_ENV,
    ENV_NESTED,
    ENV_PREFIX,
    BronzeSettings,
    BucketSettings,
    ClickHouseSettings,
    CounterSettings,
    GoldSettings,
    KafkaSettings,
    MetricsSettings,
    PageChangeSettings,
    QualitySettings,
    RemoteWriteSettings,
    SilverSettings,
    SparkSettings,
    redact_url,
)
from pipelines.errors import SettingsError


class Settings(BaseSettings):
    """All settings of the pipeline. Build with :func:`load_settings` for friendly errors."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    lake_root: str = Field(default="./lakehouse", description="folder or URL holding <layer>/<table>")
    delta_engine: Literal["delta-rs", "delta-spark"] = "delta-rs"
    delta_jars: StrList = Field(
        default_factory=list, description="Delta jars put on the JVM classpath (delta-spark engine)"
    )
    storage_options: dict[str, str] = Field(default_factory=dict, description="delta-rs object-store options")
    catalog: str | None = Field(
        default=None,
        description="with schema: tables are <catalog>.<schema>.<layer>_<name> in the metastore (delta-spark)",
    )
    schema: str | None = Field(default=None, description="the catalog schema (database) of the tables")  # type: ignore[assignment]
    table_kind: Literal["external", "managed"] = Field(
        default="external",
        description="tables by name: external (files under lake_root) or managed (the catalog keeps them)",
    )
    spark: SparkSettings = Field(default_factory=SparkSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    bronze: BronzeSettings = Field(default_factory=BronzeSettings)
    silver: SilverSettings = Field(default_factory=SilverSettings)
    page_changes: PageChangeSettings = Field(default_factory=PageChangeSettings)
    gold: GoldSettings = Field(default_factory=GoldSettings)
    buckets: BucketSettings = Field(default_factory=BucketSettings)
    remote_write: RemoteWriteSettings = Field(default_factory=RemoteWriteSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    counters: CounterSettings = Field(default_factory=CounterSettings)

    @field_validator("lake_root")
    @classmethod
    def _lake_root(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        if "://" in v and not v.startswith("file://"):
            return v.rstrip("/")
        local = v.removeprefix("file://")
        return str(Path(local).expanduser().absolute())

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if (self.catalog is None) != (self.schema is None):
            raise ValueError("catalog and schema are set together (tables are <catalog>.<schema>.<layer>_<name>)")
        if self.table_kind == "managed" and self.catalog is None:
            raise ValueError("table_kind=managed names tables in a catalog: set catalog and schema")
        if self.catalog is not None and self.delta_engine != "delta-spark":
            raise ValueError("tables by catalog name need delta_engine=delta-spark (delta-rs reads tables by path)")
        if self.silver.number_notation is not None and "number_notation" not in self.bronze.model_fields_set:
            self.bronze.number_notation = self.silver.number_notation  # its earlier name
        if self.clickhouse.dsn is None:
            if "://" in self.lake_root:
                raise ValueError("clickhouse.dsn must be set when lake_root is a remote URL")
            self.clickhouse.dsn = f"chdb://{self.lake_root}/clickhouse"
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, dotenv_settings, ConfigFileSource(settings_cls))

    def safe_dump(self) -> dict[str, Any]:
        """Settings as plain data with every secret masked, for logs and ``medallion settings``."""
        data = self.model_dump(mode="json")
        if data["clickhouse"]["dsn"]:
            data["clickhouse"]["dsn"] = redact_url(data["clickhouse"]["dsn"])
        for key in list(data["storage_options"]):
            if re.search(r"secret|key|token|password", key, re.IGNORECASE):
                data["storage_options"][key] = "**********"
        return data


class ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the file named by ``MEDALLION_CONFIG`` (YAML, TOML or JSON, by extension)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            return {}
        return read_config_file(Path(path))


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SettingsError([f"{CONFIG_ENV}: config file {str(path)!r} does not exist"])
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SettingsError([f"{where}: cannot parse: {exc.problem or exc.context}"]) from exc
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise SettingsError([f"{path}: cannot parse: {first}"]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError([f"{CONFIG_ENV}: {str(path)!r} must hold a mapping of settings"])
    unknown = [k for k in data if str(k) not in Settings.model_fields]
    if unknown:
        key = str(unknown[0])
        raise SettingsError([f"{_config_line(key, path) or path}: {key}: {unknown_key(key)}"])
    return data


def env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable that sets the field at ``loc`` (``('gold','window')``)."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    return ENV_PREFIX + ENV_NESTED.join(p.upper() for p in parts)


#: Environment variables set by ``--set``, and how the person wrote each (``--set gold.window=x``),
#: so an error about one names what was typed, not the variable it became.
ASSIGNED: dict[str, str] = {}


def setting_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every config key (``gold.window``), nested sections walked; maps and lists are leaves."""
    model = model or Settings
    keys = []
    for name, info in model.model_fields.items():
        sub = _section_of(info.annotation)
        if sub is None:
            keys.append(prefix + name)
        else:
            keys.extend(setting_keys(sub, f"{prefix}{name}."))
    return keys


def _section_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _resolve(parts: Sequence[str]) -> tuple[Any, int]:
    """The field the leading ``parts`` name and how many parts that took: all of them for a
    setting or a section, fewer below a setting that is not a section (``storage_options.X``),
    and ``(None, i)`` when part ``i`` names nothing."""
    model: type[BaseModel] | None = Settings
    info = None
    for i, part in enumerate(parts):
        if model is None:
            return info, i
        if part not in model.model_fields:
            return None, i
        info = model.model_fields[part]
        model = _section_of(info.annotation)
    return info, len(parts)


def _field(parts: Sequence[str]) -> Any:
    """The field a config key names, or None."""
    info, used = _resolve(parts)
    return info if used == len(parts) else None


def unknown_key(dotted: str) -> str | None:
    """Why ``dotted`` names no setting, with the closest one, or None when it names one (or a key
    below a map-valued setting, which takes any)."""
    parts = dotted.split(".")
    info, used = _resolve(parts)
    if info is not None:
        section = used == len(parts) and _section_of(info.annotation) is not None
        return "a section, not a setting: name one of its keys" if section else None
    close = closest_key(dotted)
    return "not a setting" + (f"; did you mean {close}?" if close else "")


def closest_key(dotted: str) -> str | None:
    """The config key or section most like ``dotted`` (a typo's likely meaning), if any is close."""
    keys = setting_keys()
    sections = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    close = difflib.get_close_matches(dotted, [*keys, *sections], n=1, cutoff=0.6)
    return close[0] if close else None


def assign(item: str) -> None:
    """``--set a.b=v``: the environment variable ``MEDALLION_A__B=v``, once the key is checked.

    The environment is what settings already read, so an override merges into its section like
    any variable would. A list setting also takes ``1,2`` (as well as JSON ``[1,2]``).
    """
    key, sep, value = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(p.strip() for p in parts):
        raise SettingsError([f"--set {item}: not KEY=VALUE (a config key such as kafka.group_id=pods)"])
    problem = unknown_key(key)
    if problem:
        raise SettingsError([f"--set {key}: {problem}"])
    info = _field(parts)
    if info is not None and _is_list(info.annotation) and not value.lstrip().startswith("["):
        value = json.dumps([v.strip() for v in value.split(",") if v.strip()])
    variable = env_name(tuple(parts))
    os.environ[variable] = value
    ASSIGNED[variable] = f"--set {key}={item.partition('=')[2]}"


def _is_list(annotation: Any) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_origin(annotation) is list or any(typing.get_origin(a) is list for a in args)


def _describe(error: dict[str, Any]) -> str:
    loc = tuple(error.get("loc", ()))
    # Keep only field names: drop list indices and the validator names pydantic appends.
    fields = [p for p in loc if isinstance(p, str) and not p.startswith("function-")]
    msg = error.get("msg", "invalid value").removeprefix("Value error, ")
    if not fields:
        return f"settings: {msg}"
    # The config key keeps list positions (metrics.aggregations[0].window); the variable cannot.
    dotted = ""
    for p in loc:
        if isinstance(p, int):
            dotted += f"[{p}]"
        elif not p.startswith("function-"):
            dotted += ("." if dotted else "") + p
    variable = env_name(tuple(fields))
    if error.get("type") == "extra_forbidden":
        close = closest_key(dotted)
        msg = "not a setting"
        if close and variable in os.environ and variable not in ASSIGNED:
            msg += f"; did you mean {env_name(tuple(close.split('.')))} ({close})?"
        elif close:
            msg += f"; did you mean {close}?"
    value = error.get("input")
    shown = ""
    if isinstance(value, str | int | float) and not re.search(r"password|secret", dotted):
        shown = f" (got {redact_url(str(value))!r})"
    if variable in ASSIGNED:
        return f"{ASSIGNED[variable]}: {msg}"
    if variable not in os.environ:
        where = _config_line(dotted)
        if where:
            return f"{where}: {dotted}: {msg}{shown}"
    return f"{variable}: {msg}{shown} [config key: {dotted}]"


def _config_line(dotted: str, path: Path | str | None = None) -> str | None:
    """``file:line`` of ``dotted`` in the config file (``path``, else the one MEDALLION_CONFIG
    names), when the file sets it."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path or Path(path).suffix.lower() not in (".yaml", ".yml", ".json"):
        return None
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", dotted):
        if isinstance(node, yaml.SequenceNode) and part.startswith("["):
            index = int(part[1:-1])
            if index >= len(node.value):
                return None
            node = node.value[index]
        elif isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == part]
            if not match:
                return None
            line = match[0][0].start_mark.line + 1
            node = match[0][1]
        else:
            return None
    return f"{path}:{line}" if line else None


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning every validation problem into a :class:`SettingsError`."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError([_describe(dict(e)) for e in exc.errors()]) from None
    except _PydanticSettingsError as exc:
        # Raised when an env value for a complex field is not valid JSON.
        m = re.search(r'field "(\w+)"', str(exc))
        prefix = env_name((m.group(1),)) if m else ENV_PREFIX
        bad = [k for k, v in os.environ.items() if k.upper().startswith(prefix) and not _is_json(v)]
        names = ", ".join(sorted(bad)) or prefix
        raise SettingsError([f"{names}: not valid JSON (objects and lists are given as JSON)"]) from None


def _is_json(text: str) -> bool:
    if not text.lstrip().startswith(("{", "[")):
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
