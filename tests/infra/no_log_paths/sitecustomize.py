"""Loaded at interpreter start when this folder is on PYTHONPATH: the guard of ``__init__.py`` on
in a process the tests start (the demo by name)."""

from tests.infra.no_log_paths import forbid_delta_log_paths

forbid_delta_log_paths()
