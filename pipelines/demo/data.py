"""The real fixtures shipped with the package (``pipelines/demo/inputs``), in the pipeline's input shape.

PostHog's capture fixtures hold *requests* (``requests_dump.jsonl``, with the events each request
produced) and raw capture payloads. The pipeline ingests events as PostHog's ingestion emits them
(``uuid, event, team_id, distinct_id, timestamp, properties``), so this module converts: the
project token becomes a team id, the event time comes from ``timestamp`` or ``now - offset``,
top-level ``$set``/``$set_once`` move into ``properties``, and ``$groupidentify`` gets its
``$group_type_index`` as PostHog's group-type mapping would give it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

DEMO_DATA = Path(str(resources.files("pipelines.demo") / "inputs"))
PAGE_CHANGE_FILES = sorted((DEMO_DATA / "wikimedia_page_change").glob("*/*.json"))
POSTHOG_DIR = DEMO_DATA / "posthog"

#: Project tokens in the fixtures -> the team ids the demo gives them.
TOKEN_TEAMS = {
    "phc_qgUFp5wz2BjC4RsFjMGpQ3PGDrsi6Q0CG0CP4NAac0I": 1,
    "abcdef123456": 2,
    "phc_NVZOyYb8hX2GDs80mQd072OT0WUrAbdQom4XeCV5Nfh": 3,
    "phc_VXRzc3poSG9GZm1JenRianJ6TTJFZGh4OWY2QXzx9f3": 4,
}
GROUP_TYPE_INDEX = {"project": 0, "organization": 1, "instance": 2}
_UUID_NS = uuid.UUID("6f0c3a8e-2f0e-4c1b-9a53-0d3e0c6b5a11")


def _iso(ts: datetime) -> str:
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def to_ingest_event(
    data: dict[str, Any], token: str, distinct_id: str | None, now: str, uid: str | None
) -> dict[str, Any]:
    """One captured event -> the ingest shape the pipeline reads."""
    properties = dict(data.get("properties") or {})
    for key in ("$set", "$set_once"):
        if data.get(key):
            properties.setdefault(key, data[key])
    if data.get("event") == "$groupidentify" and "$group_type" in properties:
        properties.setdefault("$group_type_index", GROUP_TYPE_INDEX.get(properties["$group_type"], 4))
    if data.get("timestamp"):
        ts = _parse_time(data["timestamp"])
    else:
        ts = _parse_time(now) - timedelta(milliseconds=int(data.get("offset") or 0))
    body = json.dumps(data, sort_keys=True)
    return {
        "uuid": uid or data.get("uuid") or str(uuid.uuid5(_UUID_NS, token + body)),
        "event": data.get("event"),
        "team_id": TOKEN_TEAMS.get(token, 1000 + sum(token.encode()) % 1000),
        "distinct_id": distinct_id or data.get("distinct_id") or data.get("$distinct_id"),
        "timestamp": _iso(ts),
        "properties": properties,
    }


def posthog_events() -> Iterator[dict[str, Any]]:
    """Every event in the PostHog fixtures, as ingested (88 from the capture dump, plus 3 payload events)."""
    for line in (POSTHOG_DIR / "requests_dump.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("###"):
            continue
        request = json.loads(line)
        for out in request["output"]:
            data = json.loads(out["data"])
            yield to_ingest_event(data, out["token"], out["distinct_id"], out["now"], out["uuid"])
    single = json.loads((POSTHOG_DIR / "single_event_payload.json").read_text(encoding="utf-8"))
    yield to_ingest_event(single, single["api_key"], None, single["timestamp"], None)
    batch = json.loads((POSTHOG_DIR / "batch_events_payload.json").read_text(encoding="utf-8"))
    for data in batch["batch"]:
        yield to_ingest_event(data, batch["api_key"], None, data.get("timestamp") or "", None)


def write_posthog_events(path: Path) -> Path:
    """Write the fixture events as JSON lines (byte-identical on every call)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in posthog_events()]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
    return path
