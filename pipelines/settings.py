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
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as _PydanticSettingsError

from pipelines.errors import SettingsError
from pipelines.sources.remote_write import MAX_TIMESTAMP_MS
from pipelines.sources.remote_write import Limits as RemoteWriteLimits
from silver.config import (
    AggregationSettings,
    ConfigError,
    ConfigModel,
    Duration,
    N,
    StrList,
    positive,
    unique_names,
)
from silver.config import named as find_named

ENV_PREFIX = "MEDALLION_"
ENV_NESTED = "__"
CONFIG_ENV = "MEDALLION_CONFIG"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The last instant int64 nanoseconds hold, to the millisecond: the latest sample time accepted.
LAST_SAMPLE_TIME = EPOCH + timedelta(milliseconds=MAX_TIMESTAMP_MS)

_Section = ConfigModel


class SparkSettings(_Section):
    master: str | None = Field(
        default=None,
        description="Spark master; unset means what spark-submit/the cluster gives, else local[2]",
    )
    remote: str | None = Field(
        default=None,
        description=(
            "Spark Connect: sc://host:port of a Connect server, or local[N] to start one here; "
            "unset means a classic session"
        ),
    )
    app_name: str = "medallion"
    shuffle_partitions: int = Field(default=4, ge=1, le=100_000)
    driver_memory: str = "4g"
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "ERROR"
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark confs, as a JSON object")


class KafkaTopics(_Section):
    events: str = "events"
    page_changes: str = "page_changes"


class KafkaSettings(_Section):
    bootstrap_servers: StrList = Field(default_factory=lambda: ["127.0.0.1:9092"])
    topics: KafkaTopics = Field(default_factory=KafkaTopics)
    group_id: str = "medallion-bronze"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    max_message_bytes: int = Field(default=1_000_000, ge=1)
    session_timeout: Duration = timedelta(seconds=10)
    #: Parse events in the ingest process (what Spark would accept alike; the rest goes to Spark).
    parse_in_process: bool = True

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one host:port is needed")
        for hp in v:
            if not re.match(r"^[\w.\-\[\]:]+:\d{1,5}$", hp):
                raise ValueError(f"{hp!r} is not host:port")
        return v


class ClickHouseSettings(_Section):
    dsn: str | None = Field(
        default=None,
        description="chdb:///path (embedded, default <lake_root>/clickhouse) or http(s)://host:port",
    )
    user: str = "default"
    password: SecretStr | None = None
    database: str = "default"
    insert_chunk_rows: int = Field(default=100_000, ge=1)
    ttl_days: int | None = Field(
        default=None,
        ge=1,
        le=10_000,  # ClickHouse's DateTime ends in 2106: a longer TTL would wrap and expire rows at once
        description="property_values rows expire this many days after last_seen",
    )

    @field_validator("dsn")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(chdb|https?)://", v):
            raise ValueError(f"{redact_url(v)!r} must start with chdb://, http:// or https://")
        return v


class PageChangeSettings(_Section):
    window: Duration = timedelta(minutes=5)
    allowed_lateness: Duration = timedelta(minutes=1)
    mode: Literal["staggered", "tumbling"] = "staggered"

    _check_window = field_validator("window")(lambda v: positive(v, "window"))

    @field_validator("allowed_lateness")
    @classmethod
    def _lateness(cls, v: timedelta) -> timedelta:
        if v < timedelta(0):
            raise ValueError("allowed_lateness must not be negative")
        return v


class TeamSettings(_Section):
    allow: list[int] = Field(default_factory=list, description="only these teams (empty: every team)")
    block: list[int] = Field(default_factory=list, description="never these teams")
    rollout_percent: int = Field(default=100, ge=0, le=100, description="share of teams, by a stable hash")


class GoldSettings(_Section):
    window: Duration = timedelta(seconds=30)
    grace: Duration = timedelta(seconds=60)
    min_export_count: int = Field(default=1, ge=1)
    excluded_keys: StrList = Field(default_factory=list)
    max_key_length: int = Field(default=400, ge=1)
    max_value_length: int = Field(default=255, ge=1)
    teams: TeamSettings = Field(default_factory=TeamSettings)
    top_values_per_key: int | None = Field(
        default=None, ge=1, description="the export keeps at most this many values per key and window (largest first)"
    )
    nested_values: Literal["skip", "json"] = Field(
        default="skip", description="objects and arrays: skipped, or counted as their JSON text (keys sorted)"
    )

    _check_window = field_validator("window")(lambda v: positive(v, "window"))


class BucketSettings(_Section):
    count: int = Field(default=8, ge=1, le=4096)
    mapping_file: Path | None = Field(
        default=None, description="YAML/JSON file: team_id -> bucket (and tiers); unset = hash only"
    )


class RemoteWriteSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9201, ge=0, le=65535)
    receiver_id: str = Field(
        default="default", pattern=r"^[A-Za-z0-9_.-]+$", description="names this receiver's write-ahead log"
    )
    wal_dir: Path | None = Field(default=None, description="write-ahead log folder (default <lake_root>/_wal)")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    max_decoded_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="decompressed size limit (413), decided before decoding"
    )
    max_series_per_request: int = Field(default=100_000, ge=1, description="more series in one request get 413")
    max_samples_per_request: int = Field(default=1_000_000, ge=1, description="more samples in one request get 413")
    max_labels_per_series: int = Field(default=30, ge=1, description="a series with more labels gets its request 413")
    max_label_name_bytes: int = Field(default=256, ge=1, description="a longer label name gets its request 413")
    max_label_value_bytes: int = Field(default=4096, ge=1, description="a longer label value gets its request 413")
    min_sample_time: datetime = Field(default=EPOCH, description="an earlier sample gets its request 400")
    max_sample_time: datetime = Field(
        default=LAST_SAMPLE_TIME,
        description="a later sample gets its request 400 (the default is the last instant int64 nanoseconds hold)",
    )
    max_pending_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1024, description="WAL bytes not yet in Delta before 429"
    )
    workers: int = Field(default=8, ge=1, le=256, description="threads decoding and logging requests (per process)")
    max_in_flight: int = Field(
        default=32, ge=1, le=4096, description="requests read or decoded at once (per process); more wait their turn"
    )
    idle_timeout: Duration = Field(
        default=timedelta(seconds=60),
        description="close a connection whose next request head is not in this long after it opened or was answered",
    )
    body_timeout: Duration = Field(
        default=timedelta(seconds=30), description="a body not received in full this long after its head gets 408"
    )
    processes: int = Field(
        default=1, ge=1, le=64, description="receiver processes sharing the port (SO_REUSEPORT), each with its own log"
    )
    flush_interval: Duration = timedelta(seconds=1)
    flush_max_rows: int = Field(default=500_000, ge=1)
    fsync: Literal["request", "interval"] = Field(
        default="request",
        description="request: each request's log segment is fsynced before its 2xx; "
        "interval: every fsync_interval (a power loss can lose that much)",
    )
    fsync_interval: Duration = Field(default=timedelta(seconds=1), description="with fsync: interval")

    @field_validator("idle_timeout", "body_timeout", "fsync_interval")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v

    @field_validator("min_sample_time", "max_sample_time")
    @classmethod
    def _in_range(cls, v: datetime) -> datetime:
        v = v if v.tzinfo else v.replace(tzinfo=UTC)
        if not EPOCH <= v <= LAST_SAMPLE_TIME:
            raise ValueError("must lie within 1970-01-01 .. 2262-04-11T23:47:16.854Z")
        return v

    def limits(self) -> RemoteWriteLimits:
        """What one request may hold, for the codec."""
        return RemoteWriteLimits(
            max_series=self.max_series_per_request,
            max_samples=self.max_samples_per_request,
            max_labels_per_series=self.max_labels_per_series,
            max_label_name_bytes=self.max_label_name_bytes,
            max_label_value_bytes=self.max_label_value_bytes,
            min_timestamp_ms=(self.min_sample_time - EPOCH) // timedelta(milliseconds=1),
            max_timestamp_ms=(self.max_sample_time - EPOCH) // timedelta(milliseconds=1),
        )


class QualitySettings(_Section):
    enabled: bool = Field(default=True, description="validate every batch with its table's suite before writing it")
    policies: dict[str, Literal["warn", "drop", "fail"]] = Field(
        default_factory=dict,
        description='"<table>" or "<table>:<expectation>" -> warn | drop | fail, as a JSON object',
    )

    @field_validator("policies")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[a-z_]+/[a-z_]+(:[a-z0-9_]+)?$", key):
                raise ValueError(f"{key!r} is not <layer>/<table> or <layer>/<table>:<expectation>")
        return v


def named(items: Sequence[N], name: str, missing: str) -> N:
    """The item called ``name``, else a SettingsError from ``missing`` (with {name} and {known})."""
    try:
        return find_named(items, name, missing)
    except ConfigError as exc:
        raise SettingsError(exc.problems) from None


class MetricsSettings(_Section):
    aggregations: list[AggregationSettings] = Field(
        default_factory=list, description="precomputed aggregations over bronze/samples (a YAML list)"
    )

    @field_validator("aggregations")
    @classmethod
    def _unique(cls, v: list[AggregationSettings]) -> list[AggregationSettings]:
        return unique_names(v, "aggregation")

    def get(self, name: str) -> AggregationSettings:
        return named(self.aggregations, name, "metrics.aggregations: no aggregation named {name!r} ({known})")


class CounterSettings(_Section):
    registry: Path | None = Field(default=None, description="YAML counter registry (see README: Counters)")
    window: Duration = Field(default=timedelta(minutes=1), description="window of the partial counts")

    _check_window = field_validator("window")(lambda v: positive(v, "window"))


def redact_url(url: str) -> str:
    """Hide a password embedded in a URL (``scheme://user:secret@host``)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


# ``schema`` is the settings' name for the catalog schema; pydantic's deprecated ``BaseModel.schema``
# method is what it shadows, and nothing here calls that.
warnings.filterwarnings("ignore", message='Field name "schema" in "Settings" shadows')


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
    spark: SparkSettings = Field(default_factory=SparkSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
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
        if self.catalog is not None and self.delta_engine != "delta-spark":
            raise ValueError("tables by catalog name need delta_engine=delta-spark (delta-rs reads tables by path)")
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
