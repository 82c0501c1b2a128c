"""The Databricks asset bundle: structure, every job valid, every entry point and parameter real."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from databricks.bundles.jobs import Job, JobRunAs

from pipelines.cli import cli
from pipelines.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BUNDLE = yaml.safe_load((REPO / "databricks.yml").read_text())
JOB_FILES = sorted({p for pattern in BUNDLE["include"] for p in REPO.glob(pattern)})
JOBS = {
    name: (path, spec)
    for path in JOB_FILES
    for name, spec in yaml.safe_load(path.read_text())["resources"]["jobs"].items()
}


def wheel_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = []
    for task in job["tasks"]:
        inner = task.get("for_each_task", {}).get("task", task)
        if "python_wheel_task" in inner:
            tasks.append(inner["python_wheel_task"])
    return tasks


def setting_exists(key: str) -> bool:
    model: Any = Settings
    for part in key.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation
    return True


def test_bundle_has_only_the_top_level_sections_and_every_include_matches() -> None:
    assert set(BUNDLE) == {"bundle", "include", "artifacts", "variables", "targets"}
    assert BUNDLE["bundle"]["name"] == "medallion"
    assert [a["type"] for a in BUNDLE["artifacts"].values()] == ["whl"]
    assert {"catalog", "schema", "lake_root", "kafka_bootstrap_servers", "clickhouse_url", "secret_scope"} <= set(
        BUNDLE["variables"]
    )
    assert all("default" in v for v in BUNDLE["variables"].values())
    assert {p.name for p in JOB_FILES} == {"ingest.job.yml", "silver.job.yml", "gold.job.yml", "export.job.yml"}


def test_dev_is_the_default_development_target_and_prod_is_locked_down() -> None:
    targets = BUNDLE["targets"]
    assert targets["dev"] == {"mode": "development", "default": True}
    prod = targets["prod"]
    assert prod["mode"] == "production" and prod["workspace"]["root_path"].startswith("/Workspace/")
    assert {p["level"] for p in prod["permissions"]} <= {"CAN_VIEW", "CAN_RUN", "CAN_MANAGE"}
    JobRunAs.from_dict(prod["run_as"])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_is_a_valid_databricks_job(name: str) -> None:
    path, spec = JOBS[name]
    job = Job.from_dict(spec)  # raises on unknown fields, missing required ones and bad types
    assert job.as_dict() == spec, "the resource classes would change this job"
    assert job.tasks
    used = set(re.findall(r"\$\{var\.([\w-]+)\}", path.read_text()))
    assert used <= set(BUNDLE["variables"]), f"{path.name} uses undeclared variables {used - set(BUNDLE['variables'])}"


def test_jobs_are_ingest_continuous_and_the_rest_scheduled_with_gold_fanned_out_over_buckets() -> None:
    assert JOBS["medallion_ingest"][1]["continuous"]["pause_status"] == "UNPAUSED"
    for name in ("medallion_silver", "medallion_gold", "medallion_export"):
        assert "quartz_cron_expression" in JOBS[name][1]["schedule"]
    gold = JOBS["medallion_gold"][1]["tasks"][0]["for_each_task"]
    assert (
        gold["inputs"] == "${var.buckets}" and "--bucket={{input}}" in gold["task"]["python_wheel_task"]["parameters"]
    )
    assert yaml.safe_load(BUNDLE["variables"]["buckets"]["default"]) == list(range(Settings().buckets.count))


def resolve(args: list[str]) -> list[str]:
    """Stand-ins for ``${var.*}`` and ``{{input}}``, as Databricks would substitute them."""
    return [re.sub(r"\$\{var\.[\w-]+\}", "x", re.sub(r"\{\{input\}\}", "0", a)) for a in args]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_task_calls_a_real_console_script_with_real_options_and_settings(name: str) -> None:
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    for task in wheel_tasks(JOBS[name][1]):
        assert task["package_name"] == "medallion"
        assert scripts.get(task["entry_point"]) == "pipelines.cli:main"
        args = resolve(task["parameters"])
        # Parse exactly as the CLI would, without running anything.
        ctx = cli.make_context("medallion", list(args), resilient_parsing=False)
        for item in ctx.params["assignments"]:
            assert setting_exists(item.split("=", 1)[0]), f"--set {item}: no such setting"
        group: click.Command = cli
        rest = ctx.protected_args + ctx.args
        while isinstance(group, click.Group):
            sub = group.get_command(ctx, rest[0])
            assert sub is not None, f"no command {rest[0]!r} in {args}"
            group, rest = sub, rest[1:]
            if isinstance(group, click.Group):
                continue
            sub_ctx = group.make_context(group.name or "", list(rest), parent=ctx)
            assert not sub_ctx.args, f"unexpected arguments {sub_ctx.args} in {args}"


def test_cluster_environment_names_real_settings() -> None:
    env = BUNDLE["variables"]["job_cluster"]["default"]["spark_env_vars"]
    for var in env:
        key = var.removeprefix("MEDALLION_").lower().replace("__", ".")
        assert setting_exists(key), var
    assert env["MEDALLION_DELTA_ENGINE"] == "delta-spark"
    assert env["MEDALLION_CLICKHOUSE__PASSWORD"].startswith("{{secrets/")
