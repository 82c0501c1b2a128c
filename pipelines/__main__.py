"""``python -m pipelines`` and ``spark-submit .../pipelines/__main__.py``: the medallion CLI."""

from pipelines.app.cli import main

main()
