"""The settings' sections: Spark, Kafka, ClickHouse, bronze, silver, gold, buckets, remote write, quality,
metrics and counters. :mod:`pipelines.config.settings` nests them into :class:`~pipelines.config.settings.Settings`."""

from __future__ import annotations

import re
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from bronze.primitives import ConfigModel, Duration, StrList, named, non_negative, positive, unique_names
from pipelines.errors import SettingsError
from pipelines.sources.remote_write import MAX_TIMESTAMP_MS
from pipelines.sources.remote_write import Limits as RemoteWriteLimits
from silver.config import AggregationSettings

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
            "Spark Connect: sc://host:port of a Connect server, or a master (local[N], "
            "spark://host:port) to start one here on it; unset means a classic session"
        ),
    )
    app_name: str = "medallion"
    shuffle_partitions: int = Field(default=4, ge=1, le=100_000)
    small_increment_rows: int = Field(
        default=10_000,
        ge=0,
        description=(
            "a flow run whose new rows are at most this many (by its source's commit statistics) "
            "plans each query whole, without adaptive execution, over one shuffle partition per core: "
            "a 1-event pass about a sixth sooner (docs/performance.md); 0: never"
        ),
    )
    driver_memory: str = "4g"
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "ERROR"
    generated_code: bool = Field(
        default=True,
        description=(
            "compile each query to Java, Spark's default; off, queries run interpreted: a pass of "
            "small increments, planned anew each run, costs about a fifth less (docs/performance.md)"
        ),
    )
    dataframe_debugging: bool = Field(
        default=False,
        description=(
            "pyspark's DataFrame debugging: Spark's runtime errors name the Python line that built "
            "the failing expression; each pyspark call then asks the JVM for it (half a pass's "
            "JVM calls, docs/performance.md), so jobs run without it unless this is on"
        ),
    )
    class_archive: bool = Field(
        default=True,
        description=(
            "a session this process starts maps the JVM's classes from an archive in the user's cache "
            "(Java's class-data sharing), written once by a builder process beside the first session "
            "without one: a cold start about 3 s sooner (docs/performance.md); off, every JVM loads "
            "its classes anew"
        ),
    )
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


class BronzeSettings(_Section):
    number_notation: Literal["javascript", "serde_json"] = Field(
        default="javascript",
        description=(
            "how a property's number is written in gold's values (and so in ClickHouse and the "
            "counters): JavaScript's String(x) (1, 0.000001, 1e+21), or serde_json's as PostHog's "
            "property-vals-rs writes it (1.0, 1e-6, 1e21); gold writes each event's numbers from its "
            "JSON as it counts it, so a change applies to what is counted after it"
        ),
    )


class SilverSettings(_Section):
    dedup_horizon: Duration = Field(
        default=timedelta(hours=24),
        description="an event whose (team_id, uuid) silver holds within this much event time is a repeat; 0: off",
    )
    number_notation: Literal["javascript", "serde_json"] | None = Field(
        default=None,
        description="the earlier name of bronze.number_notation, read where that one is not set",
    )

    _check_horizon = field_validator("dedup_horizon")(lambda v: non_negative(v, "dedup_horizon (0: off)"))


class PageChangeSettings(_Section):
    window: Duration = timedelta(minutes=5)
    allowed_lateness: Duration = timedelta(minutes=1)
    mode: Literal["staggered", "tumbling"] = "staggered"

    _check_window = field_validator("window")(lambda v: positive(v, "window"))

    _check_lateness = field_validator("allowed_lateness")(lambda v: non_negative(v, "allowed_lateness"))


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
    workers: int = Field(
        default=8,
        ge=1,
        le=256,
        description="threads decoding and logging requests, per process (with fsync: interval a small body is "
        "handled on the event loop)",
    )
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
    repeat_horizon: Duration = Field(
        default=timedelta(minutes=10),
        description="how long a landed sample's (series, timestamp) is remembered, so a resent copy is dropped "
        "(longer than a sender retries a request: Prometheus and vmagent retry with a backoff of at most 5 s "
        "and 1 min)",
    )
    repeat_keys: int = Field(
        default=8_000_000,
        ge=1024,
        description="(series, timestamp) keys remembered per generation (48 bytes each on disk, two generations); "
        "more within repeat_horizon shorten it, which is logged",
    )

    @field_validator("idle_timeout", "body_timeout", "fsync_interval", "repeat_horizon")
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


class MetricsSettings(_Section):
    aggregations: list[AggregationSettings] = Field(
        default_factory=list, description="precomputed aggregations over bronze/samples (a YAML list)"
    )

    @field_validator("aggregations")
    @classmethod
    def _unique(cls, v: list[AggregationSettings]) -> list[AggregationSettings]:
        return unique_names(v, "aggregation")

    def get(self, name: str) -> AggregationSettings:
        return named(
            self.aggregations, name, "metrics.aggregations: no aggregation named {name!r} ({known})", SettingsError
        )


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
