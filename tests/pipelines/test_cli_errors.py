"""What a person sees when something is wrong: one line naming what they typed, where they typed
it, and what they probably meant; arguments refused before Spark starts; no JVM or py4j noise."""

from __future__ import annotations

import logging
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import run_medallion


def one_error(out: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_version() -> None:
    out = run_medallion("--version")
    assert (out.returncode, out.stdout) == (0, f"medallion {version('medallion')}\n")


def test_the_cli_starts_without_importing_great_expectations() -> None:
    """GX's import takes about 2 CPU-seconds; the suites name their expectations and build them at
    the first validation, so a command that validates nothing starts without it."""
    probe = "import sys, pipelines.app.cli; print(sorted(m for m in sys.modules if m.startswith('great_expectations')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr


@pytest.mark.parametrize(
    ("assignment", "error"),
    [
        ("kafka.grp_id=x", "error: --set kafka.grp_id: not a setting; did you mean kafka.group_id?"),
        ("kafkaa.group_id=x", "error: --set kafkaa.group_id: not a setting; did you mean kafka.group_id?"),
        ("gold=1", "error: --set gold: a section, not a setting: name one of its keys"),
        ("gold.window=abc", "error: --set gold.window=abc: invalid duration 'abc': use e.g. 30s, 5m, 1h or PT5M"),
        ("no-equals-sign", "error: --set no-equals-sign: not KEY=VALUE (a config key such as kafka.group_id=pods)"),
    ],
)
def test_a_bad_set_names_the_key_as_typed_and_the_closest_one(tmp_path: Path, assignment: str, error: str) -> None:
    assert one_error(run_medallion("--set", assignment, "settings", cwd=tmp_path)) == error


@pytest.mark.parametrize("value", ["1,2", "1, 2", "[1,2]"])
def test_a_list_setting_takes_commas_or_json(tmp_path: Path, value: str) -> None:
    import json

    out = run_medallion("--set", f"gold.teams.allow={value}", "settings", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["gold"]["teams"]["allow"] == [1, 2]


def test_a_mistyped_variable_is_named_with_the_variable_it_likely_meant(tmp_path: Path) -> None:
    out = run_medallion("settings", env={"MEDALLION_KAFKA__GRP_ID": "x"}, cwd=tmp_path)
    assert one_error(out) == (
        "error: MEDALLION_KAFKA__GRP_ID: not a setting; did you mean MEDALLION_KAFKA__GROUP_ID (kafka.group_id)? "
        "(got 'x') [config key: kafka.grp_id]"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("gold:\n  window: [\n", "{path}:3:1: cannot parse: expected the node content, but found '<stream end>'"),
        ("gold:\n  windw: 1m\n", "{path}:2: gold.windw: not a setting; did you mean gold.window? (got '1m')"),
        ("kafk:\n  group_id: x\n", "{path}:1: kafk: not a setting; did you mean kafka?"),
        (
            "kafka:\n  group_id: pods\n  session_timeout: xyz\n",
            "{path}:3: kafka.session_timeout: invalid duration 'xyz': use e.g. 30s, 5m, 1h or PT5M (got 'xyz')",
        ),
    ],
)
def test_a_bad_config_file_names_its_path_and_line(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "medallion.yaml"
    path.write_text(text)
    out = run_medallion("settings", env={"MEDALLION_CONFIG": str(path)}, cwd=tmp_path)
    assert one_error(out) == "error: " + error.format(path=path)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["run", "silver", "--bucket", "99"],
            "error: Invalid value for --bucket: bucket(s) [99] outside 0..7 (see 'medallion run --help')",
        ),
        (
            ["validate", "bronze/nope"],
            "error: Invalid value for TABLE: no suite for bronze/nope; tables with suites: bronze/events, "
            "bronze/page_changes, silver/events, silver/page_changes, gold/property_value_partials, "
            "gold/property_values, clickhouse/property_values (see 'medallion validate --help')",
        ),
        (["run", "nope"], None),
    ],
)
def test_arguments_are_refused_in_one_line_before_spark_starts(
    tmp_path: Path, args: list[str], error: str | None
) -> None:
    out = run_medallion(*args, cwd=tmp_path)
    line = one_error(out)
    assert "starting Spark" not in out.stderr
    if error is not None:
        assert line == error
    else:
        assert line.startswith("error: Invalid value for") and line.endswith("(see 'medallion run --help')")


def test_verbose_turns_on_the_pipelines_loggers_and_leaves_py4j_at_warnings() -> None:
    from pipelines.app.cli import configure_logging

    try:
        configure_logging(verbose=True)
        assert logging.getLogger("medallion").getEffectiveLevel() == logging.DEBUG
        assert logging.getLogger("medallion.remote_write").isEnabledFor(logging.DEBUG)
        for library in ("py4j", "py4j.clientserver", "kafka", "urllib3"):
            assert logging.getLogger(library).getEffectiveLevel() == logging.WARNING, library
        assert "%(asctime)s" in logging.getLogger().handlers[0].formatter._fmt  # type: ignore[union-attr]
        configure_logging(verbose=False)
        assert logging.getLogger("medallion").getEffectiveLevel() == logging.WARNING
    finally:
        configure_logging(verbose=False)


@pytest.mark.slow
def test_a_sql_error_is_one_line_with_no_jvm_stack_trace(tmp_path: Path) -> None:
    out = run_medallion("--lake-root", str(tmp_path / "lake"), "sql", "SELECT * FROM nope", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower() or "exception" in line.lower()]
    assert len(errors) == 1, out.stderr
    assert "TABLE_OR_VIEW_NOT_FOUND" in errors[0] and "nope" in errors[0]
    assert "at org.apache" not in out.stderr and "SQLQueryContextLogger" not in out.stderr, out.stderr


@pytest.mark.parametrize(("command", "help_of"), [(["run", "silver"], "run"), (["ingest", "kafka"], "ingest kafka")])
def test_a_metrics_port_in_use_is_refused_before_spark_starts(tmp_path: Path, command: list[str], help_of: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_medallion(*command, "--metrics-port", str(port), cwd=tmp_path)
    assert one_error(out) == (
        f"error: Invalid value for --metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use "
        f"(see 'medallion {help_of} --help')"
    )
    assert "starting Spark" not in out.stderr
