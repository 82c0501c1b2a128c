"""The bundle's pipeline job, generated from the flow registry (:mod:`pipelines.flows`).

``resources/medallion.job.yml`` is this module's output, checked in; a test fails when the two
differ. Regenerate it with ``python -m pipelines.app.bundle > resources/medallion.job.yml``.

One task per stage, in the registry's order. A task depends on the stages that write what its
flows read; the side stages (metrics, counters) also wait for the export, so the pipeline's main
product reaches ClickHouse first. A stage whose flows all split by bucket becomes a ``for_each_task``
over ``var.buckets``. The settings every task shares are job parameters, declared once.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from pipelines import flows
from pipelines.runtime.flow_types import Flow

JOB = "medallion_pipeline"
#: The settings every task passes, as job parameters (name, option, default).
SHARED = (
    ("lake_root", "--lake-root", "${var.lake_root}"),
    ("catalog", "--set=catalog", "${var.catalog}"),
    ("schema", "--set=schema", "${var.schema}"),
    ("table_kind", "--set=table_kind", "${var.table_kind}"),
    ("clickhouse_dsn", "--set=clickhouse.dsn", "${var.clickhouse_url}"),
    ("kafka_bootstrap_servers", "--set=kafka.bootstrap_servers", "${var.kafka_bootstrap_servers}"),
)
#: What the ingest stage runs: one pass over Kafka (the other ingest flows are started by hand).
INGEST_ARGS = ["ingest", "kafka", "--once", "--max-batch=20000"]
#: Stages that run after the export whatever they read (they are not the pipeline's main product).
AFTER_EXPORT = ("metrics", "counters")
HEADER = """\
# GENERATED from pipelines/flows/__init__.py by `python -m pipelines.app.bundle > resources/medallion.job.yml`;
# tests/pipelines/test_bundle.py fails when the two differ. Edit the registry, not this file.
#
# The medallion pipeline as one job: every 5 minutes, Kafka -> bronze, then one task per stage of
# flows (`medallion run <stage> --once`), each starting when the stages it reads from succeeded;
# gold runs one task per team bucket. One run at a time, and a tick that finds the previous run
# still going is skipped, not queued: every flow is incremental, so the next run picks up whatever
# the skipped one would have. The settings every task passes are job parameters, declared once.
#
# Compute is chosen per target, further down: the tasks here name none (a target override can add
# a task's keys but never remove one, so one job definition runs on job clusters and serverless).
# Tasks that write to ClickHouse stay on a job cluster under serverless: the password comes from a
# secret-backed environment variable, which serverless tasks do not have.
"""


def _shared_args() -> list[str]:
    args = [f"{option}={{{{job.parameters.{name}}}}}" for name, option, _ in SHARED]
    return [args[0], "--engine=delta-spark", *args[1:]]


def _wheel(args: list[str]) -> dict[str, Any]:
    return {
        "python_wheel_task": {
            "package_name": "medallion",
            "entry_point": "medallion",
            "parameters": [*_shared_args(), *args],
        }
    }


def stage_dependencies() -> dict[str, list[str]]:
    """Stage -> the stages it waits for: those that write a table its flows read."""
    by_stage: dict[str, list[Flow]] = {}
    for f in flows.FLOWS:
        by_stage.setdefault(f.stage, []).append(f)
    writers = {t.key: f.stage for f in flows.FLOWS for t in f.targets}
    deps: dict[str, list[str]] = {}
    for stage, members in by_stage.items():
        reads = {writers[s.key] for f in members for s in (*f.sources, *f.lookups) if s.key in writers} - {stage}
        if stage in AFTER_EXPORT:
            reads.add("export")
        # Only the nearest: a stage already waited for by another dependency is left out.
        deps[stage] = sorted(s for s in reads if not any(s in _upstream(o, by_stage, writers) for o in reads))
    return deps


def _upstream(stage: str, by_stage: dict[str, list[Flow]], writers: dict[str, str]) -> set[str]:
    out: set[str] = set()
    todo = [stage]
    while todo:
        for f in by_stage[todo.pop()]:
            for s in (*f.sources, *f.lookups):
                w = writers.get(s.key)
                if w is not None and w not in out and w != stage:
                    out.add(w)
                    todo.append(w)
    return out


def _task(stage: str, deps: list[str]) -> dict[str, Any]:
    task: dict[str, Any] = {"task_key": stage, "description": _describe(stage)}
    if deps:
        task["depends_on"] = [{"task_key": d} for d in deps]
    if stage == "ingest":
        return task | _wheel(INGEST_ARGS)
    args = ["run", stage, "--once"]
    if all(f.by_bucket for f in flows.FLOWS if f.stage == stage):
        inner = {"task_key": f"{stage}_bucket"} | _wheel([*args, "--bucket={{input}}"])
        return task | {"for_each_task": {"inputs": "${var.buckets}", "concurrency": 4, "task": inner}}
    return task | _wheel(args)


def _describe(stage: str) -> str:
    """How the task's flows write (their write kinds, as ``medallion flows`` shows them): a flow
    added to a stage changes the job only if it writes in a way the stage did not."""
    members = [f for f in flows.FLOWS if f.stage == stage]
    kinds = ", ".join(dict.fromkeys(f.mode for f in members))
    return f"writes: {kinds}" + ("; one task per team bucket" if all(f.by_bucket for f in members) else "")


def _writes_clickhouse(stage: str) -> bool:
    return any(f.external_target == flows.CLICKHOUSE for f in flows.FLOWS if f.stage == stage)


def _compute(task: dict[str, Any], where: dict[str, Any]) -> dict[str, Any]:
    if "for_each_task" in task:
        return {"task_key": task["task_key"], "for_each_task": {"task": where}}
    return {"task_key": task["task_key"], **where}


def pipeline_job() -> dict[str, Any]:
    """The job file's content: the job and its compute per target."""
    deps = stage_dependencies()
    tasks = [_task(stage, deps[stage]) for stage in ("ingest", *flows.stages())]
    job = {
        "name": "medallion-pipeline",
        "schedule": {"quartz_cron_expression": "0 0/5 * * * ?", "timezone_id": "UTC"},
        "max_concurrent_runs": 1,
        "queue": {"enabled": False},
        "timeout_seconds": 3600,
        "parameters": [{"name": name, "default": default} for name, _, default in SHARED],
        "tasks": tasks,
    }
    cluster = {"job_cluster_key": "medallion", "libraries": [{"whl": "../dist/*.whl"}]}
    job_clusters = [{"job_cluster_key": "medallion", "new_cluster": "${var.job_cluster}"}]
    classic = {"job_clusters": job_clusters, "tasks": [_compute(t, cluster) for t in tasks]}
    serverless = {
        "environments": [
            {
                "environment_key": "default",
                "spec": {"environment_version": "5", "dependencies": ["../dist/*.whl"]},
            }
        ],
        "job_clusters": job_clusters,
        "tasks": [
            _compute(t, cluster if _writes_clickhouse(t["task_key"]) else {"environment_key": "default"}) for t in tasks
        ],
    }
    return {
        "resources": {"jobs": {JOB: job}},
        "targets": {
            "dev": {"resources": {"jobs": {JOB: classic}}},
            "prod": {"resources": {"jobs": {JOB: classic}}},
            "serverless": {"resources": {"jobs": {JOB: serverless}}},
        },
    }


def render() -> str:
    """The job file's text."""

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    body = yaml.dump(pipeline_job(), Dumper=_NoAliases, sort_keys=False, width=110, default_flow_style=False)
    return HEADER + body


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
