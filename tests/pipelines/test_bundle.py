"""The Databricks asset bundle: layout, every job valid in every target, the pipeline's task graph,
compute per target, the runtime's Spark version, and every entry point and parameter real."""

from __future__ import annotations

import copy
import os
import re
import tomllib
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from databricks.bundles.jobs import ClusterSpec, Job, JobRunAs
from packaging.specifiers import SpecifierSet

from pipelines.app.cli import cli
from pipelines.config.settings import Settings, env_name, load_settings

REPO = Path(__file__).resolve().parents[2]
BUNDLE = yaml.safe_load((REPO / "databricks.yml").read_text())
JOB_FILES = sorted({p for pattern in BUNDLE["include"] for p in REPO.glob(pattern)})
DOCS = {path: yaml.safe_load(path.read_text()) for path in JOB_FILES}
JOBS = {name: (path, spec) for path, doc in DOCS.items() for name, spec in doc["resources"]["jobs"].items()}
TARGETS = sorted(BUNDLE["targets"])
#: Job parameters (declared once per job) by name, with their defaults.
JOB_PARAMS = {p["name"]: p["default"] for _, job in JOBS.values() for p in job.get("parameters", [])}
PIPELINE = "medallion_pipeline"
MAINTENANCE = "medallion_maintenance"

# Databricks Runtime (cluster spark_version key) -> the Apache Spark it ships, from the release notes:
# https://docs.databricks.com/aws/en/release-notes/runtime/ (versions table: 16.4 LTS 3.5.2,
# 17.3 LTS 4.0.0, 18 4.1.0, 19 4.2.0), https://docs.databricks.com/aws/en/release-notes/runtime/18
# ("Databricks Runtime 18, powered by Apache Spark 4.1.0") and .../runtime/18.0 (the same for 18.0).
# The metric panes call kll_sketch_agg_double, which Spark has since 4.1.
RUNTIME_SPARK = {
    "16.4.x-scala2.12": (3, 5),
    "16.4.x-scala2.13": (3, 5),
    "17.3.x-scala2.13": (4, 0),
    "18.0.x-scala2.13": (4, 1),
    "18.2.x-scala2.13": (4, 1),
    "18.x-scala2.13": (4, 1),
    "19.x-scala2.13": (4, 2),
}
# Serverless environment version -> the Spark API of its Databricks Connect, from
# https://docs.databricks.com/aws/en/release-notes/serverless/environment-version/ (version 4:
# Databricks Connect 17.2, Spark 4.0; version 5: Databricks Connect 18, Spark 4.1).
SERVERLESS_SPARK = {"3": (3, 5), "4": (4, 0), "5": (4, 1)}
NEEDS_SPARK = (4, 1)
# Both ship Python 3.12.3 (the same release notes pages).
RUNTIME_PYTHON = "3.12.3"

#: Stand-ins for the bundle variables, as a deployment would resolve them.
SAMPLE_VARS = {
    "lake_root": "s3://bucket/medallion",
    "catalog": "main",
    "schema": "medallion",
    "table_kind": "managed",
    "clickhouse_url": "https://clickhouse.internal:8443",
    "kafka_bootstrap_servers": "kafka:9092",
    "buckets": "[0, 1]",
    "secret_scope": "medallion",
}
#: Settings every task passes (with the lake root a URL, settings need clickhouse.dsn too).
COMMON_ARGS = [
    "--lake-root=${var.lake_root}",
    "--engine=delta-spark",
    "--set=catalog=${var.catalog}",
    "--set=schema=${var.schema}",
    "--set=table_kind=${var.table_kind}",
    "--set=clickhouse.dsn=${var.clickhouse_url}",
]
#: Tasks that write to ClickHouse and so need the password from the secret scope.
CLICKHOUSE_COMMANDS = (["run", "export"], ["run", "counters"])
#: Lists a target override merges by key (anything else in an override replaces).
KEYED = {"tasks": "task_key", "job_clusters": "job_cluster_key", "environments": "environment_key"}


def merge(base: Any, over: Any) -> Any:
    """A target override applied as the Databricks CLI does: mappings deep-merged, tasks, job
    clusters and environments matched by their keys."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key in KEYED and key in out:
            items = out[key]
            index = {item[KEYED[key]]: i for i, item in enumerate(items)}
            for item in value:
                if item[KEYED[key]] in index:
                    items[index[item[KEYED[key]]]] = merge(items[index[item[KEYED[key]]]], item)
                else:
                    items.append(copy.deepcopy(item))
        else:
            out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
    return out


def job_in(name: str, target: str) -> dict[str, Any]:
    """The job as ``target`` deploys it: its file's resources merged with every target override."""
    spec = JOBS[name][1]
    for doc in [BUNDLE, *DOCS.values()]:
        override = doc.get("targets", {}).get(target, {}) or {}
        spec = merge(spec, override.get("resources", {}).get("jobs", {}).get(name, {}))
    return spec


def all_tasks(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every task that runs something: top-level ones and the inner task of a for_each task."""
    for task in job["tasks"]:
        yield task.get("for_each_task", {}).get("task", task)


def wheel_args(task: dict[str, Any]) -> list[str]:
    """A task's arguments, its job parameters replaced by their defaults (as a scheduled run has them)."""
    return [
        re.sub(r"\{\{job\.parameters\.(\w+)\}\}", lambda m: JOB_PARAMS[m.group(1)], a)
        for a in task["python_wheel_task"]["parameters"]
    ]


def command(args: list[str]) -> list[str]:
    """The subcommand words of a task's arguments (``["run", "gold"]``), global options left out."""
    return [a for a in args if not a.startswith("-")][:2]


def resolve(args: list[str]) -> list[str]:
    """``${var.*}`` and ``{{input}}`` substituted as Databricks would."""
    return [
        re.sub(r"\$\{var\.([\w-]+)\}", lambda m: SAMPLE_VARS[m.group(1)], a.replace("{{input}}", "0")) for a in args
    ]


def setting_exists(key: str) -> bool:
    model: Any = Settings
    for part in key.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation
    return True


def spark_of(runtime: str) -> tuple[int, int]:
    assert runtime in RUNTIME_SPARK, f"{runtime}: not a Databricks Runtime this test knows the Spark version of"
    return RUNTIME_SPARK[runtime]


# -- layout -------------------------------------------------------------------------------------
def test_bundle_has_only_the_top_level_sections_and_one_file_per_job_under_resources() -> None:
    assert set(BUNDLE) == {"bundle", "include", "artifacts", "variables", "targets"}
    assert BUNDLE["bundle"]["name"] == "medallion"
    assert BUNDLE["include"] == ["resources/*.job.yml"]
    assert [a["type"] for a in BUNDLE["artifacts"].values()] == ["whl"]
    assert {p.name for p in JOB_FILES} == {"medallion.job.yml", "maintenance.job.yml"}
    assert not (REPO / "pipelines" / "resources").exists()
    for path, doc in DOCS.items():
        assert set(doc) <= {"resources", "targets"}, path.name
        assert len(doc["resources"]["jobs"]) == 1, f"{path.name}: one job per file"
    assert set(JOBS) == {PIPELINE, MAINTENANCE}


def test_variables_catalog_schema_and_an_external_location_with_nothing_under_volumes() -> None:
    variables = BUNDLE["variables"]
    assert set(SAMPLE_VARS) | {"job_cluster"} == set(variables)
    lake_root = variables["lake_root"]
    assert "default" not in lake_root, "lake_root names an external location: each target gives its own"
    assert all("default" in v for k, v in variables.items() if k != "lake_root")
    assert "external location" in lake_root["description"]
    assert "s3://" in lake_root["description"] and "abfss://" in lake_root["description"]
    for path in [REPO / "databricks.yml", *JOB_FILES]:
        assert "/Volumes" not in path.read_text(), f"{path.name} puts something under a Volume"


def test_targets_dev_is_the_default_prod_is_locked_down_and_each_names_compute_for_each_job() -> None:
    targets = BUNDLE["targets"]
    assert set(targets) == {"dev", "serverless", "prod"}
    assert targets["dev"]["mode"] == "development" and targets["dev"]["default"] is True
    assert [t for t, spec in targets.items() if spec.get("default")] == ["dev"]
    prod = targets["prod"]
    assert prod["mode"] == "production" and prod["workspace"]["root_path"].startswith("/Workspace/")
    assert {p["level"] for p in prod["permissions"]} <= {"CAN_VIEW", "CAN_RUN", "CAN_MANAGE"}
    JobRunAs.from_dict(prod["run_as"])
    for path, doc in DOCS.items():
        assert set(doc.get("targets", {})) == set(targets), f"{path.name}: compute for every target, no other"


# -- jobs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [None, *TARGETS])
@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_is_a_valid_databricks_job_in_every_target(name: str, target: str | None) -> None:
    spec: Any = JOBS[name][1] if target is None else job_in(name, target)
    job = Job.from_dict(spec)  # raises on unknown fields, missing required ones and bad types
    assert job.as_dict() == spec, "the resource classes would change this job"
    assert job.tasks
    text = JOBS[name][0].read_text()
    used = set(re.findall(r"\$\{var\.([\w-]+)\}", text))
    assert used <= set(BUNDLE["variables"]), f"undeclared variables {used - set(BUNDLE['variables'])}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_task_runs_on_exactly_one_compute_that_the_job_defines(name: str, target: str) -> None:
    job = job_in(name, target)
    clusters = {c["job_cluster_key"]: c["new_cluster"] for c in job.get("job_clusters", [])}
    environments = {e["environment_key"]: e["spec"] for e in job.get("environments", [])}
    for task in all_tasks(job):
        where = [k for k in ("job_cluster_key", "environment_key", "existing_cluster_id", "new_cluster") if k in task]
        assert len(where) == 1, f"{target}: task {task['task_key']} runs on {where or 'nothing'}"
        if "job_cluster_key" in task:
            assert task["job_cluster_key"] in clusters
            assert task["libraries"] == [{"whl": "../dist/*.whl"}], "the wheel goes on the cluster as a library"
        else:
            assert task["environment_key"] in environments
            assert "libraries" not in task, "serverless tasks get the wheel from their environment"
        if command(wheel_args(task)) in CLICKHOUSE_COMMANDS:
            # The password is a secret-backed environment variable, which only job clusters have.
            assert clusters[task["job_cluster_key"]] == "${var.job_cluster}"
    assert set(clusters.values()) <= {"${var.job_cluster}"}
    # Nothing in the job files themselves picks compute: targets do (an override cannot remove a key).
    for task in all_tasks(JOBS[name][1]):
        assert not {"job_cluster_key", "environment_key", "libraries"} & set(task)


def test_classic_targets_use_job_clusters_and_serverless_uses_environments() -> None:
    for name in JOBS:
        for target in ("dev", "prod"):
            assert all("job_cluster_key" in t for t in all_tasks(job_in(name, target)))
        on_serverless = [t["task_key"] for t in all_tasks(job_in(name, "serverless")) if "environment_key" in t]
        assert on_serverless, f"{name}: nothing runs serverless in the serverless target"
    serverless = {t["task_key"] for t in all_tasks(job_in(PIPELINE, "serverless")) if "environment_key" in t}
    assert serverless == {"ingest", "silver", "gold_bucket", "metrics"}


def test_serverless_environments_name_the_wheel_and_a_spark_4_1_client() -> None:
    seen = 0
    for name in JOBS:
        for target in TARGETS:
            for env in job_in(name, target).get("environments", []):
                seen += 1
                spec = env["spec"]
                assert "client" not in spec, "environment_version replaces the deprecated client"
                assert SERVERLESS_SPARK[spec["environment_version"]] >= NEEDS_SPARK
                assert spec["dependencies"] == ["../dist/*.whl"]
    assert seen


def test_the_job_cluster_runtime_ships_spark_4_1_and_reads_unity_catalog() -> None:
    cluster = BUNDLE["variables"]["job_cluster"]["default"]
    assert ClusterSpec.from_dict(cluster).as_dict() == cluster
    assert spark_of(cluster["spark_version"]) >= NEEDS_SPARK
    assert cluster["data_security_mode"] in {"SINGLE_USER", "USER_ISOLATION", "DATA_SECURITY_MODE_DEDICATED"}
    assert spark_of("17.3.x-scala2.13") < NEEDS_SPARK  # why 17.3 LTS, the runtime before, would not do


def test_the_runtime_python_can_install_the_wheel() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert RUNTIME_PYTHON in SpecifierSet(requires), (
        f"pyproject.toml requires-python {requires!r} excludes Python {RUNTIME_PYTHON} of Databricks "
        "Runtime 18 and serverless environment 5: pip would refuse to install the wheel there"
    )


def test_cluster_environment_names_real_settings() -> None:
    env = BUNDLE["variables"]["job_cluster"]["default"]["spark_env_vars"]
    for var in env:
        key = var.removeprefix("MEDALLION_").lower().replace("__", ".")
        assert setting_exists(key), var
    assert env["MEDALLION_DELTA_ENGINE"] == "delta-spark"
    assert env["MEDALLION_CLICKHOUSE__PASSWORD"] == "{{secrets/${var.secret_scope}/clickhouse_password}}"


# -- the pipeline ---------------------------------------------------------------------------------
def test_drift_check_the_pipeline_job_file_is_the_one_the_flow_registry_generates() -> None:
    """A drift check, not a check of the job: it fails while the committed file and what the
    generator makes of the registry today differ. What the job does is checked by the other tests."""
    from pipelines.app import bundle

    assert (REPO / "resources" / "medallion.job.yml").read_text() == bundle.render(), (
        "resources/medallion.job.yml differs from the flow registry: regenerate it with "
        "`python -m pipelines.app.bundle > resources/medallion.job.yml`"
    )


def test_every_flow_medallion_run_knows_runs_in_exactly_one_task() -> None:
    from pipelines import flows

    ran: list[str] = []
    for task in all_tasks(JOBS[PIPELINE][1]):
        words = command(wheel_args(task))
        if words[0] == "run":
            ran += [f.name for f in flows.resolve(words[1])]
    assert sorted(ran) == sorted(f.name for f in flows.runnable())


def test_shared_settings_are_declared_once_as_job_parameters() -> None:
    job = JOBS[PIPELINE][1]
    names = [p["name"] for p in job["parameters"]]
    assert len(names) == len(set(names))
    for task in all_tasks(job):
        raw = task["python_wheel_task"]["parameters"]
        assert not [a for a in raw if "${var." in a], f"{task['task_key']}: a variable not through a job parameter"
        assert set(re.findall(r"\{\{job\.parameters\.(\w+)\}\}", " ".join(raw))) == set(names)


def test_the_pipeline_runs_ingest_silver_gold_per_bucket_export_then_metrics_and_counters() -> None:
    job = JOBS[PIPELINE][1]
    tasks = {t["task_key"]: t for t in job["tasks"]}
    deps = {k: sorted(d["task_key"] for d in t.get("depends_on", [])) for k, t in tasks.items()}
    assert deps == {
        "ingest": [],
        "silver": ["ingest"],
        "gold": ["silver"],
        "export": ["gold"],
        "metrics": ["export"],
        "counters": ["export"],
    }
    # Acyclic: every task can be placed after all it depends on.
    placed: list[str] = []
    while len(placed) < len(deps):
        ready = [k for k, d in deps.items() if k not in placed and set(d) <= set(placed)]
        assert ready, f"a cycle among {set(deps) - set(placed)}"
        placed += sorted(ready)
    commands = {k: command(wheel_args(t)) for k, t in zip(tasks, all_tasks(job), strict=True)}
    assert commands == {
        "ingest": ["ingest", "kafka"],
        "silver": ["run", "silver"],
        "gold": ["run", "gold"],
        "export": ["run", "export"],
        "metrics": ["run", "metrics"],
        "counters": ["run", "counters"],
    }
    for task in all_tasks(job):
        assert "--once" in wheel_args(task), f"{task['task_key']} must stop when done"
    assert any(a.startswith("--max-batch=") for a in wheel_args(tasks["ingest"]))
    gold = tasks["gold"]["for_each_task"]
    assert gold["inputs"] == "${var.buckets}" and "--bucket={{input}}" in wheel_args(gold["task"])
    assert yaml.safe_load(BUNDLE["variables"]["buckets"]["default"]) == list(range(Settings().buckets.count))


def test_jobs_are_scheduled_one_run_at_a_time_and_never_continuous() -> None:
    for name, (_, job) in JOBS.items():
        assert "continuous" not in job and "trigger" not in job, name
        assert re.fullmatch(r"[\d*/?, -]+", job["schedule"]["quartz_cron_expression"]), name
        assert job["max_concurrent_runs"] == 1, name
    assert JOBS[PIPELINE][1]["schedule"]["quartz_cron_expression"].split()[1] == "0/5"
    assert JOBS[PIPELINE][1]["queue"] == {"enabled": False}, "an overdue tick is skipped, not queued behind"


def test_a_maintenance_job_optimizes_and_vacuums_with_at_least_7_days_retention() -> None:
    (task,) = JOBS[MAINTENANCE][1]["tasks"]
    args = wheel_args(task)
    assert command(args) == ["maintain"]
    hours = [int(a.split("=", 1)[1]) for a in args if a.startswith("--vacuum-hours=")]
    assert hours and hours[0] >= 168 and "--force-short-retention" not in args


# -- every task's command line --------------------------------------------------------------------
def wheel_tasks() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, (_, job) in JOBS.items():
        for task in all_tasks(job):
            yield f"{name}.{task['task_key']}", task


@pytest.mark.parametrize(("where", "task"), list(wheel_tasks()), ids=[w for w, _ in wheel_tasks()])
def test_every_task_passes_the_lake_the_engine_and_the_catalog_schema(where: str, task: dict[str, Any]) -> None:
    args = wheel_args(task)
    assert args[: len(COMMON_ARGS)] == COMMON_ARGS, where


@pytest.mark.parametrize(("where", "task"), list(wheel_tasks()), ids=[w for w, _ in wheel_tasks()])
def test_every_task_calls_a_real_console_script_with_real_options_and_settings(
    where: str, task: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = task["python_wheel_task"]
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert wheel["package_name"] == "medallion"
    assert scripts.get(wheel["entry_point"]) == "pipelines.app.cli:main"
    args = resolve(wheel_args(task))
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
    # The settings those options make are valid (as the task loads them, minus the cluster's env).
    for key in [k for k in os.environ if k.startswith("MEDALLION_")]:
        monkeypatch.delenv(key)
    for item in ctx.params["assignments"]:
        key, _, value = item.partition("=")
        monkeypatch.setenv(env_name(tuple(key.split("."))), value)
    settings = load_settings(lake_root=ctx.params["lake_root"], delta_engine=ctx.params["engine"])
    assert (settings.catalog, settings.schema) == (SAMPLE_VARS["catalog"], SAMPLE_VARS["schema"])
    assert settings.lake_root == SAMPLE_VARS["lake_root"]
