"""ClickHouse through clickhouse-connect: the embedded chdb engine by default, any server over HTTP.

The embedded engine holds one data path per process, so every use opens the client in a
``with`` block and closes it after.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.config.sections import ClickHouseSettings
from pipelines.config.settings import Settings, redact_url
from pipelines.errors import MedallionError

PROPERTY_VALUES_TABLE = "property_values"
PROPERTY_VALUES_COLUMNS = (
    "team_id",
    "property_type",
    "property_key",
    "property_value",
    "window_start",
    "count",
)
# Tokens of this many recent inserts are remembered, so a retried insert is not applied twice.
DEDUP_WINDOW = 100_000

PROPERTY_VALUES_DDL = f"""
CREATE TABLE IF NOT EXISTS {{db}}.{PROPERTY_VALUES_TABLE} (
    team_id Int64,
    property_type LowCardinality(String),
    property_key String,
    property_value String,
    window_start DateTime64(3, 'UTC'),
    `count` Int64,
    last_seen DateTime64(3, 'UTC')
)
ENGINE = SummingMergeTree(`count`)
ORDER BY (team_id, property_type, property_key, property_value, window_start)
{{ttl}}
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
"""
#: Added to a table made before the column existed; its rows get their window's start.
LAST_SEEN_COLUMN = "last_seen DateTime64(3, 'UTC') DEFAULT window_start"


COUNTERS_TABLE = "counters"
COUNTERS_DDL = f"""
CREATE TABLE IF NOT EXISTS {{db}}.{COUNTERS_TABLE} (
    counter LowCardinality(String),
    entity String,
    total Int64,
    version Int64,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (counter, entity)
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
"""


class ClickHouseError(MedallionError):
    """ClickHouse could not be reached or refused a statement."""


@contextmanager
def connect(settings: Settings | ClickHouseSettings) -> Iterator[Any]:
    """A clickhouse-connect client for ``settings.clickhouse`` (or those ClickHouse settings
    themselves); closed when the block ends."""
    client = _open(settings)
    try:
        yield client
    finally:
        client.close()


@contextmanager
def connecting(settings: Settings | ClickHouseSettings) -> Iterator[Callable[[], Any]]:
    """:func:`connect`, begun in a thread of its own: the block gets a callable that waits for the
    client (raising :class:`ClickHouseError` as ``connect`` would) and does other work meanwhile.
    Opening the embedded engine reads its tables' metadata (0.1-0.2 s), which an export overlaps
    with its Spark queries. The client is closed when the block ends, used or not."""
    with ThreadPoolExecutor(1, thread_name_prefix="clickhouse-connect") as pool:
        opening = pool.submit(_open, settings)
        try:
            yield opening.result
        finally:
            client = None if opening.exception() else opening.result()  # an error not asked for: nothing to close
            if client is not None:
                client.close()


def _open(settings: Settings | ClickHouseSettings) -> Any:
    import clickhouse_connect

    ch = settings.clickhouse if isinstance(settings, Settings) else settings
    dsn = ch.dsn or ""
    if embedded(ch) and importlib.util.find_spec("chdb") is None:
        raise ClickHouseError(
            f"the embedded ClickHouse ({redact_url(dsn)}) needs chdb, which is not installed: "
            "pip install 'medallion[local]', or set clickhouse.dsn to a ClickHouse server"
        )
    try:
        if embedded(ch):
            Path(dsn.removeprefix("chdb://")).mkdir(parents=True, exist_ok=True)
            return clickhouse_connect.get_client(dsn=dsn)
        return clickhouse_connect.get_client(
            dsn=dsn,
            username=ch.user,
            password=ch.password.get_secret_value() if ch.password else "",
            database=ch.database,
        )
    except Exception as exc:
        raise ClickHouseError(f"cannot connect to ClickHouse at {redact_url(dsn)}: {exc}") from exc


def ttl_clause(days: int | None) -> str:
    return f"TTL toDateTime(last_seen) + INTERVAL {int(days)} DAY" if days else ""


def ensure_property_values(client: Any, database: str = "default", ttl_days: int | None = None) -> None:
    """Create the table if missing; bring one made by an earlier version up to date: add
    ``last_seen``, and set the TTL when ``ttl_days`` asks for one it lacks (a TTL set before is
    left alone when ``ttl_days`` is unset: ``ALTER TABLE ... REMOVE TTL`` removes it)."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(PROPERTY_VALUES_DDL.format(db=database, ttl=ttl_clause(ttl_days)))
    table = f"{database}.{PROPERTY_VALUES_TABLE}"
    client.command(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {LAST_SEEN_COLUMN}")
    if ttl_days:
        sql = "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {name:String}"
        engine = client.query(sql, parameters={"db": database, "name": PROPERTY_VALUES_TABLE}).result_rows[0][0]
        if f"TTL toDateTime(last_seen) + toIntervalDay({int(ttl_days)})" not in engine:
            client.command(f"ALTER TABLE {table} MODIFY {ttl_clause(ttl_days)}")


def ensure_counters(client: Any, database: str = "default") -> None:
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(COUNTERS_DDL.format(db=database))


def insert(client: Any, table: str, data: pa.Table, token: str, database: str = "default") -> None:
    """Insert ``data``; ClickHouse drops a repeat of the same ``token`` (insert deduplication)."""
    client.insert_arrow(
        f"{database}.{table}",
        data,
        settings={"insert_deduplication_token": token, "insert_deduplicate": 1},
    )


def embedded(settings: Settings | ClickHouseSettings) -> bool:
    """Whether ClickHouse is the embedded engine (chdb), which reads this machine's files itself."""
    ch = settings.clickhouse if isinstance(settings, Settings) else settings
    return (ch.dsn or "").startswith("chdb://")


#: Characters a path may not hold to be named in ``file()``'s pattern (its glob syntax, quotes).
_PATTERN = set("{}*?,'\\[]")


def insert_files(
    client: Any, table: str, columns: dict[str, str], paths: list[str], token: str, database: str = "default"
) -> bool:
    """Insert the rows of the Parquet files ``paths`` (local, read by ClickHouse itself: the
    embedded engine) in one statement: ``columns`` maps each column of the table to its expression
    over the files' columns. ClickHouse drops a repeat of the same ``token``: the files are read
    in their order by one thread, so a repeat cuts the same blocks (a block of over a million rows
    takes the token with its number). False where the paths cannot be named in ``file()``'s pattern
    (files in several folders, or a path with its syntax in it)."""
    folders = {os.path.dirname(p) for p in paths}
    if len(folders) != 1 or any(c in _PATTERN for p in paths for c in p):
        return False
    names = ", ".join(f"`{c}`" for c in columns)
    exprs = ", ".join(f"{e} AS `{c}`" for c, e in columns.items())
    files = f"{folders.pop()}/{{{','.join(os.path.basename(p) for p in paths)}}}"
    client.command(
        f"INSERT INTO {database}.{table} ({names}) SELECT {exprs} FROM file('{files}', Parquet)",
        settings={
            "insert_deduplication_token": token,
            "insert_deduplicate": 1,
            "max_threads": 1,
            "max_insert_threads": 1,
        },
    )
    return True


def query_rows(client: Any, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in client.query(sql).result_rows]


def read_property_values(client: Any, database: str = "default") -> pa.Table:
    """Every row of the property-values table, merged as queries see it (``FINAL``)."""
    columns = ", ".join(f"`{c}`" for c in PROPERTY_VALUES_COLUMNS)
    ensure_property_values(client, database)
    return client.query_arrow(f"SELECT {columns} FROM {database}.{PROPERTY_VALUES_TABLE} FINAL")
