"""Maintenance on a tiny delta-rs lake: OPTIMIZE compacts, VACUUM keeps what retention protects."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from pipelines.app.cli import cli
from pipelines.app.maintenance import maintain_tables, select_tables
from pipelines.config.settings import Settings
from pipelines.errors import InputError
from pipelines.runtime.tables import ALL_TABLES, EXPORTS
from pipelines.storage import open_store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def commit(i: int) -> pa.Table:
    return pa.table(
        {
            "sink": ["clickhouse"] * 2,
            "source": ["gold/property_values"] * 2,
            "from_version": [i, i],
            "rows": [10 * i, 10 * i + 1],
            "exported_at": pa.array([T0, T0], pa.timestamp("us", tz="UTC")),
        }
    )


def rows(settings: Settings) -> list[dict[str, object]]:
    table = DeltaTable(f"{settings.lake_root}/{EXPORTS.layer}/{EXPORTS.name}").to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: (r["from_version"], r["rows"]))


def test_maintain_compacts_a_table_without_changing_its_rows(settings: Settings) -> None:
    store = open_store(settings, None)  # delta-rs: no Spark needed for Arrow in and out
    store.ensure(EXPORTS)
    for i in range(3):
        store.append(EXPORTS, commit(i))
    before = rows(settings)
    assert store.stats(EXPORTS).files == 3

    done = maintain_tables(store, ALL_TABLES)

    by_table = {m.table: m for m in done}
    assert set(by_table) == {t.key for t in ALL_TABLES}
    assert {m.status for k, m in by_table.items() if k != EXPORTS.key} == {"missing"}
    result = by_table[EXPORTS.key]
    assert (result.status, result.files_before, result.files_after) == ("done", 3, 1)
    assert result.vacuumed == 0  # the replaced files are younger than the 7-day retention
    assert rows(settings) == before
    assert store.stats(EXPORTS).files == 1
    assert "OPTIMIZE" in [h["operation"] for h in store.history(EXPORTS, 3)]


def test_short_retention_is_refused_unless_forced(settings: Settings) -> None:
    store = open_store(settings, None)
    with pytest.raises(InputError, match="--force-short-retention"):
        maintain_tables(store, [EXPORTS], retention_hours=24)
    # Forced, medallion's guard steps aside (the table is not there yet, so nothing runs).
    assert [m.status for m in maintain_tables(store, [EXPORTS], 24, force_short_retention=True)] == ["missing"]


def test_tables_are_named_layer_slash_name() -> None:
    assert select_tables(["_meta/exports", "_meta/exports"]) == [EXPORTS]
    with pytest.raises(InputError, match="unknown table 'gold/nope'"):
        select_tables(["gold/nope"])


def test_the_command_refuses_a_short_retention_before_starting_spark() -> None:
    result = CliRunner().invoke(cli, ["maintain", "--vacuum-hours=1"])
    assert result.exit_code != 0
    assert isinstance(result.exception, InputError) and "under 168" in str(result.exception)


def test_the_command_prints_what_it_did(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(settings, None)
    store.ensure(EXPORTS)
    for i in range(2):
        store.append(EXPORTS, commit(i))
    ctx = SimpleNamespace(settings=settings, store=store, say=lambda _: None)
    monkeypatch.setattr("pipelines.app.cli.State.context", lambda self, validates=False: ctx)  # no Spark needed

    result = CliRunner().invoke(cli, ["maintain", "--table=_meta/exports", "--table=gold/counters"])

    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.output.splitlines() if "/" in line and "│" in line}
    assert [c.strip() for c in lines["_meta/exports"].split("│")[2:5]] == ["done", "2", "1"]
    assert "not created yet" in lines["gold/counters"]
