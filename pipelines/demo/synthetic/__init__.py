"""Seeded synthetic input for the demo and the benchmark: PostHog-style events and MediaWiki page changes.

The public fixture sets are tiny (88 events, one page's history), so they cannot show what the
pipeline is for. This module makes inputs of any size that do:

- ``generate_events`` yields product events "as ingested". Team volume is Zipf-skewed so that a few
  teams dominate (bucketing and the per-team fan-out must cope with that), property keys and values
  are Zipf-skewed so the gold counts have heavy hitters and a long tail, and a small share of values
  are nulls, nested objects, arrays, empty or over-long strings so every fan-out skip rule fires.
  Some events carry ``$set``/``$set_once`` person properties or are ``$groupidentify`` events, and a
  few carry ``properties`` as a JSON string, as the capture format allows.
- ``generate_small_events`` yields small events (a few flat properties each), as a new user's
  first export holds them: the bench's event path runs on them.
- ``generate_page_changes`` yields ``mediawiki.page_change.v1`` events in *arrival* order: mostly by
  event time, but some arrive late and some twice, and busy pages get several changes within a few
  minutes, which is what the silver reordering and windowed dedup exist for.

Everything is drawn from a ``random.Random`` seeded by the spec, never from global random state, the
clock or set iteration order, so the same spec always gives the same records and the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pipelines.demo.synthetic.common import EventsSpec, PageChangesSpec
from pipelines.demo.synthetic.events import generate_events
from pipelines.demo.synthetic.page_changes import generate_page_changes
from pipelines.demo.synthetic.small_events import generate_small_events

__all__ = [
    "EventsSpec",
    "PageChangesSpec",
    "generate_events",
    "generate_page_changes",
    "generate_small_events",
    "write_jsonl_batches",
]


# --------------------------------------------------------------------------------------------------
# Files


def write_jsonl_batches(
    records: Iterable[dict[str, Any]], directory: Path, prefix: str, batches: int, interleave: bool = False
) -> list[Path]:
    """Writes ``records`` as ``batches`` JSON Lines files ``{prefix}-{i:03d}.jsonl`` under
    ``directory`` and returns their paths.

    By default each file is a contiguous slice, in order; sizes differ by at most one line
    (earlier files get the extra lines). With ``interleave`` record ``i`` goes to file
    ``i % batches``, as when several pods consume one stream at once: every file then covers the
    whole time span. A file may be empty when there are fewer records than batches.
    """
    if batches < 1:
        raise ValueError("batches must be >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    if interleave:  # record i to file i % batches: written as the records come, none kept
        files = [directory / f"{prefix}-{b:03d}.jsonl" for b in range(batches)]
        with ExitStack() as stack:
            # Bytes, not text mode, so no platform newline translation can change the output.
            outs = [stack.enter_context(path.open("wb")) for path in files]
            for i, r in enumerate(records):
                outs[i % batches].write(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        return files
    # Split sizes need the total; serialized lines are far smaller than the dicts they come from.
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records]
    size, extra = divmod(len(lines), batches)
    paths: list[Path] = []
    start = 0
    for b in range(batches):
        end = start + size + (1 if b < extra else 0)
        chunk = lines[start:end]
        path = directory / f"{prefix}-{b:03d}.jsonl"
        # Bytes, not text mode, so no platform newline translation can change the output.
        path.write_bytes("".join(f"{line}\n" for line in chunk).encode("utf-8"))
        paths.append(path)
        start = end
    return paths
