"""``medallion serve remote-write`` as a separate command, for the bench's steady-state stage."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from pipelines.config.settings import env_name

FLUSH_INTERVAL = "0.5s"


class ReceiverCommand:
    """The receiver command with ``processes`` processes on a free loopback port of the lake of
    ``settings``; ``remote_write`` sets remote-write settings by key (``{"fsync": "interval"}``)."""

    def __init__(
        self,
        settings: Any,
        processes: int,
        workers: int,
        timeout: float = 120.0,
        remote_write: dict[str, str] | None = None,
    ) -> None:
        self.settings, self.processes = settings, processes
        self.timeout = timeout
        self.log = Path(settings.lake_root) / "_logs" / "receiver.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
        env |= {
            "MEDALLION_LAKE_ROOT": str(settings.lake_root),
            "MEDALLION_DELTA_ENGINE": settings.delta_engine,
            "MEDALLION_REMOTE_WRITE__FLUSH_INTERVAL": FLUSH_INTERVAL,
            "MEDALLION_REMOTE_WRITE__WORKERS": str(workers),
        }
        env |= {env_name(("remote_write", key)): value for key, value in (remote_write or {}).items()}
        command = [sys.executable, "-c", "from pipelines.app.cli import main; main()", "serve", "remote-write"]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:  # a file, not a pipe nobody reads once it listens
            self.proc = subprocess.Popen(
                [*command, "--port", "0", "--processes", str(processes)], env=env, stderr=log, text=True
            )
        self.port = self._listening()

    def _listening(self) -> int:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"http://[^:]+:(\d+)/api/v1/write", self.log.read_text())
            if m:
                return int(m.group(1))
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"the receiver did not start: {self.log.read_text()[-2000:]}")

    def __enter__(self) -> ReceiverCommand:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if kind is None and self.proc.returncode != 0:
            raise RuntimeError(f"the receiver exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
