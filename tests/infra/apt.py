"""Debian packages for the real servers (Prometheus, node-exporter, VictoriaMetrics), installed on
demand under a lock that keeps two test workers from running apt at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

# The binary that proves a package is usable; packages not listed are checked with dpkg-query.
_APT_BINARIES = {
    "prometheus": "prometheus",
    "prometheus-node-exporter": "prometheus-node-exporter",
    "victoria-metrics": "vmagent",
}
_APT_UPDATE_TIMEOUT_S = 300
_APT_INSTALL_TIMEOUT_S = 600
_apt_lock = threading.Lock()
_APT_LOCK_FILE = Path(tempfile.gettempdir()) / "medallion-tests-apt.lock"
_apt_updated = False


def _apt_package_present(package: str) -> bool:
    binary = _APT_BINARIES.get(package)
    if binary is not None:
        return shutil.which(binary) is not None
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False, timeout=30
    )
    return done.returncode == 0 and done.stdout.strip() == "install ok installed"


def _apt_run(argv: list[str], timeout_s: float) -> str | None:
    """None on success, else a reason with the tail of apt's output."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv)}` did not finish within {timeout_s:.0f}s"
    except OSError as exc:
        return f"`{' '.join(argv)}` could not run: {exc}"
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
        return f"`{' '.join(argv)}` failed with code {done.returncode}:\n{tail}"
    return None


def ensure_apt_packages(*packages: str) -> str | None:
    """Install missing Debian packages; None when they are usable, else why not.

    The project's machines are fresh Debian with root, so installing on demand keeps the real
    integration tests runnable without a separate setup step. The postinst scripts try to start their
    services through invoke-rc.d, which refuses without systemd or a runlevel (and policy-rc.d, where
    present, refuses too), so no daemon is left on the default ports; the fixtures use other ports
    regardless.
    """
    global _apt_updated
    # Workers are processes: the file lock keeps two of them from running apt at once (the thread
    # lock, two threads of one worker).
    with _apt_lock, open(_APT_LOCK_FILE, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        missing = [p for p in packages if not _apt_package_present(p)]
        if not missing:
            return None
        if os.geteuid() != 0:
            return f"Debian packages missing and not root: `sudo apt-get install -y {' '.join(missing)}`"
        if shutil.which("apt-get") is None:
            return f"Debian packages missing and no apt-get: {' '.join(missing)}"
        # Other sessions may run apt at the same time: wait for dpkg's lock instead of failing.
        lock_wait = ["-o", "DPkg::Lock::Timeout=120"]
        if not _apt_updated:
            reason = _apt_run(["apt-get", *lock_wait, "update"], _APT_UPDATE_TIMEOUT_S)
            if reason is not None:
                return reason
            _apt_updated = True
        reason = _apt_run(
            ["apt-get", *lock_wait, "install", "-y", "--no-install-recommends", *missing], _APT_INSTALL_TIMEOUT_S
        )
        if reason is not None:
            return reason
        still = [p for p in missing if not _apt_package_present(p)]
        if still:
            return f"apt-get install succeeded but {' '.join(still)} still not usable"
        return None
