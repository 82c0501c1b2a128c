"""The metrics servers for integration tests, from Debian's packages: Prometheus, node-exporter and
vmagent on loopback, with their fixtures (a shared node-exporter, and factories for Prometheus and
vmagent pointed at a test's own remote-write receiver)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import yaml

from pipelines.dev.services import LOOPBACK, ServerProcess, ServerStartError
from tests.infra.apt import ensure_apt_packages
from tests.infra.common import http_get, require_or_skip


def _scrape_config(job: str, targets: Sequence[str]) -> dict[str, Any]:
    return {"job_name": job, "static_configs": [{"targets": list(targets)}]}


class NodeExporter(ServerProcess):
    """Debian's ``prometheus-node-exporter`` (1.5.0) on 127.0.0.1.

    The systemd collector, on by default in Debian's build, is disabled: without systemd it logs an
    error on every scrape. The textfile collector reads :attr:`textfile_dir`, so a test can publish
    its own metrics by dropping ``*.prom`` files there.
    """

    name = "node-exporter"
    binary = "prometheus-node-exporter"

    def __init__(self, *, extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra_args = list(extra_args)
        self.textfile_dir = self.workdir / "textfile"
        self.textfile_dir.mkdir(exist_ok=True)

    @property
    def target(self) -> str:
        """``host:port`` as a Prometheus scrape target."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}/metrics"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            f"--web.listen-address={self.target}",
            "--no-collector.systemd",
            f"--collector.textfile.directory={self.textfile_dir}",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, body = http_get(self.url)
        return status == 200 and b"node_exporter_build_info" in body


class Prometheus(ServerProcess):
    """Debian's ``prometheus`` (2.42) on 127.0.0.1, scraping every 1 s and remote-writing to one URL.

    The queue settings make the first POST arrive ~6 s after start (the remote-write WAL watcher's
    first pass takes ~5.5 s) and then one POST per second. Console template dirs point into the
    scratch dir so the Debian console libraries are not needed.
    """

    name = "prometheus"
    binary = "prometheus"

    def __init__(
        self,
        remote_write_url: str,
        scrape_targets: Sequence[str],
        extra_remote_write: Mapping[str, Any] | None = None,
        *,
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.remote_write_url = remote_write_url
        self.scrape_targets = list(scrape_targets)
        self.extra_remote_write = dict(extra_remote_write or {})
        self.extra_args = list(extra_args)
        self.config_path = self.workdir / "prometheus.yml"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def config(self) -> dict[str, Any]:
        remote_write: dict[str, Any] = {
            "url": self.remote_write_url,
            "queue_config": {
                "batch_send_deadline": "1s",
                "min_backoff": "100ms",
                "max_backoff": "1s",
                "max_samples_per_send": 2000,
            },
        }
        extra = dict(self.extra_remote_write)
        # Merge queue_config key by key so a caller can change one setting without restating all.
        remote_write["queue_config"].update(extra.pop("queue_config", {}))
        remote_write.update(extra)
        return {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                _scrape_config("node", self.scrape_targets),
                _scrape_config("prometheus", [f"{LOOPBACK}:{self.port}"]),
            ],
            "remote_write": [remote_write],
        }

    def _prepare(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def _argv(self) -> list[str]:
        consoles = self.workdir / "consoles"
        consoles.mkdir(exist_ok=True)
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            f"--web.console.templates={consoles}",
            f"--web.console.libraries={consoles}",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, _ = http_get(f"{self.url}/-/ready")
        return status == 200


class VmAgent(ServerProcess):
    """Debian's ``vmagent`` (victoria-metrics 1.79.5) on 127.0.0.1, scraping and remote-writing.

    This version speaks plain Prometheus remote-write (snappy, ``X-Prometheus-Remote-Write-Version:
    0.1.0``): it neither probes ``?get_vm_proto_version=1`` nor sends zstd, which came in later
    releases. It flushes every second, so the first POST arrives ~1 s after start.
    """

    name = "vmagent"
    binary = "vmagent"

    def __init__(
        self,
        remote_write_url: str,
        scrape_targets: Sequence[str],
        *,
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.remote_write_url = remote_write_url
        self.scrape_targets = list(scrape_targets)
        self.extra_args = list(extra_args)
        self.config_path = self.workdir / "scrape.yml"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _prepare(self) -> None:
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [_scrape_config("node", self.scrape_targets)],
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _argv(self) -> list[str]:
        return [
            self.binary,
            f"-httpListenAddr={LOOPBACK}:{self.port}",
            f"-promscrape.config={self.config_path}",
            f"-remoteWrite.url={self.remote_write_url}",
            f"-remoteWrite.tmpDataPath={self.workdir / 'remotewrite-data'}",
            "-remoteWrite.flushInterval=1s",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, _ = http_get(f"{self.url}/health")
        return status == 200


@pytest.fixture(scope="session")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    """One node-exporter for the session: read-only, so tests can share it."""
    reason = ensure_apt_packages("prometheus-node-exporter")
    if reason is not None:
        require_or_skip(f"node-exporter unavailable: {reason}")
    exporter = NodeExporter(workdir=tmp_path_factory.mktemp("node-exporter"))
    try:
        exporter.start()
    except ServerStartError as exc:
        require_or_skip(f"node-exporter would not start: {exc}")
    try:
        yield exporter
    finally:
        exporter.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """``make(remote_write_url, scrape_targets, extra_remote_write=None) -> started Prometheus``.

    A factory because each test points Prometheus at its own receiver; every instance started is
    stopped at teardown, even when the test fails half-way.
    """
    reason = ensure_apt_packages("prometheus")
    if reason is not None:
        require_or_skip(f"prometheus unavailable: {reason}")
    started: list[Prometheus] = []

    def make(
        remote_write_url: str,
        scrape_targets: Sequence[str],
        extra_remote_write: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Prometheus:
        server = Prometheus(
            remote_write_url,
            scrape_targets,
            extra_remote_write,
            workdir=tmp_path_factory.mktemp("prometheus"),
            **kwargs,
        )
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def vmagent_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VmAgent]]:
    """``make(remote_write_url, scrape_targets, extra_args=()) -> started VmAgent``, stopped at teardown."""
    reason = ensure_apt_packages("victoria-metrics")
    if reason is not None:
        require_or_skip(f"vmagent unavailable: {reason}")
    started: list[VmAgent] = []

    def make(remote_write_url: str, scrape_targets: Sequence[str], **kwargs: Any) -> VmAgent:
        server = VmAgent(remote_write_url, scrape_targets, workdir=tmp_path_factory.mktemp("vmagent"), **kwargs)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(started):
            server.stop()
