"""Charts are an extra: ``pip install 'medallion[charts]'`` brings matplotlib. A cluster task that
only runs jobs never needs it."""

from __future__ import annotations

from typing import Any

from pipelines.errors import MedallionError

CHARTS_EXTRA = "pip install 'medallion[charts]'"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or an error saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise MedallionError(f"charts need matplotlib, which is not installed: {CHARTS_EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
