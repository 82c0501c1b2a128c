"""The event path as a scheduled job runs it: ``medallion ingest file``, then ``medallion run all
--once --drain``, each a fresh process on a fresh lake (its own session, JVM and ClickHouse), timed
from its start to its exit, beside the warm figures of the same stages; and its plain-Spark peer as
``spark-submit`` runs a job: one fresh process that runs the event path's peers
(:mod:`pipelines.dev.bench.plain`: the plain program) over the same files, Parquet from one to the
next (``python -m pipelines.dev.bench.cold FILE...``).

No warm-up run: every run is cold by design. The JVM's class archive (``spark.class_archive``) is
what a user's second run finds: the bench's own session started its builder long before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from pipelines.config.class_archive import NOT_INHERITED
from pipelines.dev.bench.measure import Bench, jvm_mb, rss_mb
from pipelines.dev.bench.workloads import Workload

COLD_INGEST = "cold: files -> bronze (events)"
COLD_RUN = "cold: run all --once --drain"
COLD_CHAIN = "cold chain (events)"
COLD_PEER = "plain Spark: cold chain (events)"
#: The warm figure each cold one is read against (``0.60x of warm``).
WARM = {COLD_INGEST: "files -> bronze (events)", COLD_CHAIN: "end to end (events)"}


#: A hang guard, not a timing: M's cold pass takes about a minute on 2 cores.
TIMEOUT_SECONDS = 1800


def run_process(argv: Sequence[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """Run ``argv`` to its end: its wall seconds and the peak resident memory (MB) of it
    (``driver``) and of its JVM (``jvm``), sampled every 50 ms. Raises with the end of its output
    when it fails or outlives :data:`TIMEOUT_SECONDS`; a process left by an error is killed."""
    peak = {"driver": 0.0, "jvm": 0.0}
    with tempfile.TemporaryFile() as output:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                peak["driver"] = max(peak["driver"], rss_mb(proc.pid))
                peak["jvm"] = max(peak["jvm"], jvm_mb(proc.pid))
                if time.perf_counter() - t0 > TIMEOUT_SECONDS:
                    raise TimeoutError(f"{' '.join(argv[3:6])} ran over {TIMEOUT_SECONDS} s")
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()  # its JVM, a child, sees its stdin close and exits
                proc.wait()
        seconds = time.perf_counter() - t0
        if proc.returncode:
            output.seek(0)
            said = output.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(argv[3:6])} exited {proc.returncode}: {said}")
    return seconds, {name: round(mb, 1) for name, mb in peak.items()}


def cold_chain(b: Bench, w: Workload) -> None:
    """``repeats`` cold runs of the event path over the chain's files: the ingest, the pass of
    every flow, and their sum (the cold chain), each against its warm figure."""
    files = [str(p) for p in w.chain_files()]
    cli = [sys.executable, "-m", "pipelines"]
    ingest, run, chain, peer = (b.figure(name, "events") for name in (COLD_INGEST, COLD_RUN, COLD_CHAIN, COLD_PEER))
    for attempt in range(b.repeats):
        work = b.out / "work" / f"cold-{attempt}"
        shutil.rmtree(work, ignore_errors=True)
        # A user's fresh process: nothing of the bench's session (its gateway, a Connect server).
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env |= {
            "MEDALLION_LAKE_ROOT": str(work / "lake"),
            "MEDALLION_QUALITY__ENABLED": "true",  # as the warm chain it is read against
            # chdb holds one data path per process: the bench's own is not the job's
            "MEDALLION_CLICKHOUSE__DSN": f"chdb://{work / 'clickhouse'}",
            "MEDALLION_CLICKHOUSE__DATABASE": "cold",
        }
        took_in, rss_in = run_process([*cli, "ingest", "file", "--kind", "events", *files], env)
        took_run, rss_run = run_process([*cli, "run", "all", "--once", "--drain"], env)
        ingest.record(took_in, w.n_events, rss_in)
        run.record(took_run, w.n_events, rss_run)
        both = {k: max(rss_in[k], rss_run[k]) for k in rss_in}
        chain.record(took_in + took_run, w.n_events, both)
        shutil.rmtree(work, ignore_errors=True)
        # The peer, in a fresh process of its own, between the chain's runs (the machine's noise alike).
        took_peer, rss_peer = run_process([sys.executable, "-m", "pipelines.dev.bench.cold", *files], env)
        peer.record(took_peer, w.n_events, rss_peer)
        shutil.rmtree(work, ignore_errors=True)
    run.note = "every flow of run all, on the lake the cold ingest left; events through the event path"
    chain.note = "the two processes one after the other: what a scheduled job pays, start-up included"
    ingest.note = "a fresh process from start to exit; no warm-up run, as every run is cold"
    peer.note = "one fresh process: the event path's plain-Spark peers over the same files, start-up included"
    chain.peers["plain Spark"] = COLD_PEER
    for name, warm in WARM.items():
        if warm in b.figures:
            b.figures[name].peers["warm"] = warm


def peer_chain(files: Sequence[str]) -> None:
    """The event path's plain program over ``files`` (:mod:`pipelines.dev.bench.plain`): bronze,
    silver, gold and the bulk insert, each reading what the one before wrote, as a Spark job
    submitted once does (run in a fresh process by :func:`cold_chain`; settings from the
    environment, as the chain's)."""
    from functools import partial

    from pipelines.config.settings import load_settings
    from pipelines.config.spark import build_spark
    from pipelines.dev.bench import plain
    from pipelines.runtime.runner import Context
    from pipelines.runtime.tables import BRONZE_EVENTS, GOLD_PROPERTY_VALUES, SILVER_EVENTS
    from pipelines.storage import open_store

    settings = load_settings()
    spark = build_spark(settings)
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)
    out = f"{settings.lake_root}/plain"
    write = partial(plain.write_plain, spark, out)
    plain.land_files(ctx, spark.createDataFrame([(f,) for f in files], "path string"), write)
    plain.silver_events(ctx, spark.read.parquet(f"{out}/{BRONZE_EVENTS.key}"), write)
    plain.gold(ctx, spark.read.parquet(f"{out}/{SILVER_EVENTS.key}"), write)
    plain.export(ctx, spark.read.parquet(f"{out}/{GOLD_PROPERTY_VALUES.key}"), write)


if __name__ == "__main__":
    peer_chain(sys.argv[1:])
