"""Data-quality suites as code (Great Expectations 1.x), one builder per table, and the runner that
turns their results into warn / drop / fail."""

import os

# GX sends usage analytics by default; a pipeline must not phone home unless asked to.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
