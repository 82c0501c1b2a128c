"""Each stage's Spark jobs from Spark's event log: a hand-written log, figures worked out by hand."""

from __future__ import annotations

import json
from typing import Any

from pipelines.dev.bench import sparklog

SQL = "org.apache.spark.sql.execution.ui."


def line(event: str, **fields: Any) -> str:
    return json.dumps({"Event": event, **fields}, separators=(",", ":")) + "\n"


def job_start(job: int, ms: int, query: int | None) -> str:
    props = {} if query is None else {"spark.sql.execution.id": str(query)}
    return line("SparkListenerJobStart", **{"Job ID": job, "Submission Time": ms, "Properties": props})


def job_end(job: int, ms: int) -> str:
    return line("SparkListenerJobEnd", **{"Job ID": job, "Completion Time": ms})


LOG = [
    line("SparkListenerLogStart", **{"Spark Version": "4.2.0"}),
    line(SQL + "SparkListenerSQLExecutionStart", executionId=0, time=1000, physicalPlanDescription="x"),
    job_start(0, 1500, 0),
    job_start(1, 1800, 0),  # overlaps job 0
    line("SparkListenerTaskEnd", **{"Stage ID": 0}),
    job_end(0, 2000),
    job_end(1, 2500),
    line(SQL + "SparkListenerSQLExecutionStart", executionId=1, time=3000),  # a command: no job
    line(SQL + "SparkListenerSQLExecutionStart", executionId=2, time=4000),
    job_start(2, 4250, 2),
    job_end(2, 4750),
    job_start(3, 5000, None),  # an RDD job, no query
    job_end(3, 5100),
    '{"Event":"SparkListenerJobStart","Job ID":4,"Submiss',  # the line Spark is writing
]


def test_a_window_counts_its_queries_jobs_and_the_time_before_each_querys_first_job() -> None:
    jobs, queries = sparklog.read(LOG)
    assert sparklog.window_figures(jobs, queries, 0.5, 6.0) == {
        "queries": 3,
        "jobs": 4,
        "job_seconds": 1.6,  # [1.5, 2.5] as the union of two jobs, [4.25, 4.75], [5.0, 5.1]
        "before_jobs_seconds": 0.75,  # query 0: 1.0 -> 1.5; query 2: 4.0 -> 4.25
    }
    # A job running at the window's end counts up to it; query 0 started before the window.
    assert sparklog.window_figures(jobs, queries, 2.9, 4.5) == {
        "queries": 2,
        "jobs": 1,
        "job_seconds": 0.25,
        "before_jobs_seconds": 0.25,
    }


def test_stages_take_the_median_of_their_runs_and_leave_out_those_without_jobs() -> None:
    jobs, queries = sparklog.read(LOG)
    windows = {"a stage": [(0.5, 6.0), (2.9, 4.5), (0.9, 2.6)], "no Spark": [(10.0, 11.0)]}
    assert sparklog.stage_figures(jobs, queries, windows) == {
        # runs: (3 queries, 4 jobs, 1.6, 0.75, 5.5 s), (2, 1, 0.25, 0.25, 1.6), (1, 2, 1.0, 0.5, 1.7)
        "a stage": {"queries": 2, "jobs": 2, "job_seconds": 1.0, "before_jobs_seconds": 0.5, "seconds": 1.7}
    }


def test_the_report_has_a_row_per_stage_with_the_rest_outside_spark() -> None:
    figures = {"gold": {"queries": 9, "jobs": 20, "job_seconds": 6.0, "before_jobs_seconds": 2.5, "seconds": 10.0}}
    text = "\n".join(sparklog.markdown(figures))
    assert "| gold | 10.00 | 9 | 20 | 6.00 | 2.50 | 1.50 |" in text
    assert sparklog.markdown({}) == []
