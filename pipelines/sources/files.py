"""Files to land: JSON lines, a JSON array, or one JSON object per file.

Each record keeps its bytes as they came where the file gives them one by one (a line, or the
whole file for a single object); elements of a JSON array are re-serialised compactly, since the
array only delimits them. A line that is not JSON is still a record: bronze quarantines it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from bronze.landing import LANDING_SCHEMA
from pipelines.storage.base import conform

LANDING_ARROW_SCHEMA = to_arrow_schema(LANDING_SCHEMA, timezone="UTC")


@dataclass(frozen=True)
class FileBatch:
    path: Path
    digest: str  # sha256 of the content: a file is landed once per content
    records: list[bytes]

    @property
    def batch_id(self) -> str:
        return f"file:{self.digest[:16]}"


def read_records(path: Path, content: bytes) -> FileBatch:
    digest = hashlib.sha256(content).hexdigest()
    text = content.decode("utf-8", errors="surrogateescape")
    stripped = text.strip()
    records: list[bytes]
    whole = None
    if stripped.startswith(("[", "{")):
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
    if isinstance(whole, list):
        records = [json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8") for item in whole]
    elif isinstance(whole, dict):
        records = [stripped.encode("utf-8", errors="surrogateescape")]
    else:
        records = [line.rstrip(b"\r") for line in content.split(b"\n") if line.strip()]
    return FileBatch(Path(path).absolute(), digest, records)


def landing_table(batches: list[FileBatch], now: datetime) -> pa.Table:
    """The landing rows (bronze input) for ``batches``: one row per record with its file and position."""
    n = sum(len(b.records) for b in batches)
    columns: dict[str, pa.Array] = {
        "value": pa.array([r for b in batches for r in b.records], pa.binary()),
        "source": pa.array(["file"] * n, pa.string()),
        "offset": pa.array([i for b in batches for i in range(len(b.records))], pa.int64()),
        "source_file": pa.array([str(b.path) for b in batches for _ in b.records], pa.string()),
        "ingest_time": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        "batch_id": pa.array([b.batch_id for b in batches for _ in b.records], pa.string()),
    }
    return conform(pa.table(columns), LANDING_ARROW_SCHEMA)
