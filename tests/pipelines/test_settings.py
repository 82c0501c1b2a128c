from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from pipelines.config.settings import load_settings
from pipelines.errors import SettingsError
from tests.helpers import run_medallion


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No MEDALLION_* from the outside and no .env in the working directory."""
    import os

    for key in list(os.environ):
        if key.startswith("MEDALLION_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_defaults() -> None:
    s = load_settings()
    assert s.lake_root == str(Path.cwd() / "lakehouse")
    assert s.delta_engine == "delta-rs"
    assert s.clickhouse.dsn == f"chdb://{Path.cwd() / 'lakehouse'}/clickhouse"
    assert (s.page_changes.window, s.gold.window, s.gold.grace) == (
        timedelta(minutes=5),
        timedelta(seconds=30),
        timedelta(seconds=60),
    )
    assert s.kafka.topics.events == "events" and s.kafka.topics.page_changes == "page_changes"


def test_environment_with_nested_delimiter_and_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", "/data/lake")
    monkeypatch.setenv("MEDALLION_GOLD__WINDOW", "2m")
    monkeypatch.setenv("MEDALLION_PAGE_CHANGES__ALLOWED_LATENESS", "PT90S")
    monkeypatch.setenv("MEDALLION_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9093")
    monkeypatch.setenv("MEDALLION_KAFKA__TOPICS__EVENTS", "posthog_events")
    monkeypatch.setenv("MEDALLION_SPARK__CONF", '{"spark.sql.shuffle.partitions": "8"}')
    s = load_settings()
    assert s.lake_root == "/data/lake"
    assert s.gold.window == timedelta(minutes=2)
    assert s.page_changes.allowed_lateness == timedelta(seconds=90)
    assert s.kafka.bootstrap_servers == ["k1:9092", "k2:9093"]
    assert s.kafka.topics.events == "posthog_events"
    assert s.spark.conf == {"spark.sql.shuffle.partitions": "8"}
    assert s.clickhouse.dsn == "chdb:///data/lake/clickhouse"


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_config_file_named_by_medallion_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"medallion{suffix}"
    if suffix == ".yaml":
        path.write_text("lake_root: /srv/lake\ngold:\n  window: 1m\nbuckets:\n  count: 16\n")
    else:
        path.write_text('lake_root = "/srv/lake"\n[gold]\nwindow = "1m"\n[buckets]\ncount = 16\n')
    monkeypatch.setenv("MEDALLION_CONFIG", str(path))
    monkeypatch.setenv("MEDALLION_BUCKETS__COUNT", "32")  # the environment wins over the file
    s = load_settings()
    assert (s.lake_root, s.gold.window, s.buckets.count) == ("/srv/lake", timedelta(minutes=1), 32)


def test_dotenv_file_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("MEDALLION_DELTA_ENGINE=delta-spark\n")
    assert load_settings().delta_engine == "delta-spark"


def test_every_bad_field_gets_one_line_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDALLION_GOLD__WINDOW", "soon")
    monkeypatch.setenv("MEDALLION_BUCKETS__COUNT", "0")
    monkeypatch.setenv("MEDALLION_DELTA_ENGINE", "duckdb")
    monkeypatch.setenv("MEDALLION_CLICKHOUSE__DSN", "postgres://u:hunter2@h/db")
    with pytest.raises(SettingsError) as err:
        load_settings()
    problems = err.value.problems
    assert len(problems) == 4
    assert any(p.startswith("MEDALLION_GOLD__WINDOW: invalid duration 'soon'") for p in problems)
    assert any(p.startswith("MEDALLION_BUCKETS__COUNT:") for p in problems)
    assert any(p.startswith("MEDALLION_DELTA_ENGINE:") for p in problems)
    assert any(p.startswith("MEDALLION_CLICKHOUSE__DSN:") for p in problems)
    assert "hunter2" not in str(err.value)


def test_missing_or_broken_config_file_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEDALLION_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(SettingsError, match=r"MEDALLION_CONFIG: config file .* does not exist"):
        load_settings()
    bad = tmp_path / "bad.yaml"
    bad.write_text("gold: [unclosed\n")
    monkeypatch.setenv("MEDALLION_CONFIG", str(bad))
    with pytest.raises(
        SettingsError, match=r"bad\.yaml:2:1: cannot parse: expected .,. or .\]., but got .<stream end>."
    ):
        load_settings()


def test_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDALLION_CLICKHOUSE__DSN", "https://ch.example:8443")
    monkeypatch.setenv("MEDALLION_CLICKHOUSE__PASSWORD", "hunter2")
    monkeypatch.setenv("MEDALLION_KAFKA__SASL_PASSWORD", "swordfish")
    s = load_settings()
    assert s.clickhouse.password is not None and s.clickhouse.password.get_secret_value() == "hunter2"
    dumped = str(s.safe_dump()) + repr(s) + str(s)
    assert "hunter2" not in dumped and "swordfish" not in dumped


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_medallion(*args, env=env, cwd=cwd)


def test_cli_exits_2_with_one_line_per_bad_setting(tmp_path: Path) -> None:
    out = run_cli(
        "settings",
        env={"MEDALLION_GOLD__GRACE": "-", "MEDALLION_SPARK__SHUFFLE_PARTITIONS": "x"},
        cwd=tmp_path,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("error: MEDALLION_") and lines[1].startswith("error: MEDALLION_")
    assert "Traceback" not in out.stderr


def test_cli_settings_and_help_never_show_secrets(tmp_path: Path) -> None:
    env = {"MEDALLION_CLICKHOUSE__PASSWORD": "hunter2", "MEDALLION_CLICKHOUSE__DSN": "http://u:pw123@h:8123"}
    shown = run_cli("settings", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout and "pw123" not in shown.stdout and "http://u:***@h:8123" in shown.stdout
    helped = run_cli("--help", env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "hunter2" not in helped.stdout and "medallion" in helped.stdout


METRICS_YAML = """
metrics:
  aggregations:
    - name: cpu
      selector: node_cpu_seconds_total{mode!="idle", cpu=~"0|1"}
      window: 5m
      slide: 1m
      accumulators: [increase, quantiles]
      grouping_labels: [mode]
"""


def test_metric_aggregations_from_a_yaml_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "medallion.yaml"
    path.write_text(METRICS_YAML)
    monkeypatch.setenv("MEDALLION_CONFIG", str(path))
    (agg,) = load_settings().metrics.aggregations
    assert agg.selector == 'node_cpu_seconds_total{mode!="idle",cpu=~"0|1"}'
    assert (agg.window, agg.slide, agg.late, agg.accumulators) == (
        timedelta(minutes=5),
        timedelta(minutes=1),
        "drop",
        ["increase", "quantiles"],
    )
    tumbling = load_settings(metrics={"aggregations": [{"name": "t", "selector": "up", "window": "30s"}]})
    assert tumbling.metrics.aggregations[0].slide == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("aggregation", "message"),
    [
        ({"window": "5m", "slide": "2m"}, "must be a whole multiple of slide"),
        ({"window": "1m", "slide": "5m"}, "must be a whole multiple of slide"),
        ({"accumulators": ["sum", "p99"]}, "unknown accumulator(s) ['p99']"),
        ({"accumulators": ["distinct"]}, "distinct count label values: set aggregated_labels"),
        ({"accumulators": ["increase"], "late": "forward"}, "late: forward cannot be used with increase"),
        ({"selector": 'up{job=~"("}'}, "bad regex"),
        ({"selector": '{job="x"}'}, "a selector needs a metric name"),
        ({"selector": "up{job=x}"}, "cannot read a matcher"),
        ({"grouping_labels": ["job"], "rollup_labels": ["job"]}, "both in grouping_labels and rollup_labels"),
        ({"late": "later"}, "metrics.aggregations[0].late"),
        ({"name": "Bad Name"}, "metrics.aggregations[0].name"),
    ],
)
def test_bad_metric_aggregations_name_the_problem(aggregation: dict, message: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(metrics={"aggregations": [{"name": "a", "selector": "up", **aggregation}]})
    assert message in str(err.value)


def test_aggregation_names_are_unique_and_looked_up_with_a_clear_error() -> None:
    twice = [{"name": "a", "selector": "up"}, {"name": "a", "selector": "down"}]
    with pytest.raises(SettingsError, match="used twice"):
        load_settings(metrics={"aggregations": twice})
    settings = load_settings(metrics={"aggregations": twice[:1]})
    with pytest.raises(SettingsError, match="no aggregation named 'b' \\(a\\)"):
        settings.metrics.get("b")


def test_the_number_notation_is_bronzes_and_its_earlier_silver_name_still_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().bronze.number_notation == "javascript"
    monkeypatch.setenv("MEDALLION_SILVER__NUMBER_NOTATION", "serde_json")
    assert load_settings().bronze.number_notation == "serde_json"  # the earlier name, where bronze's is unset
    monkeypatch.setenv("MEDALLION_BRONZE__NUMBER_NOTATION", "javascript")
    assert load_settings().bronze.number_notation == "javascript"  # bronze's own wins
