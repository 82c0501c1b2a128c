"""The synthetic generators: deterministic, shaped as specified, and messy in the ways the demo needs."""

from __future__ import annotations

import json
import statistics
import uuid
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from pipelines.demo.synthetic import (
    EventsSpec,
    PageChangesSpec,
    generate_events,
    generate_page_changes,
    write_jsonl_batches,
)

EVENTS = EventsSpec(events=5_000, teams=50, keys=80, values_per_key=40)
CHANGES = PageChangesSpec(pages=300, changes=2_000, span_seconds=2 * 3600)
PAGE_CHANGE_KINDS = {"create", "edit", "move", "delete", "undelete", "visibility_change"}
CHANGELOG_KIND = {
    "create": "insert",
    "undelete": "insert",
    "delete": "delete",
    "edit": "update",
    "move": "update",
    "visibility_change": "update",
}


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def properties_of(event: dict[str, Any]) -> dict[str, Any]:
    props = event["properties"]
    return json.loads(props) if isinstance(props, str) else props


def key_of(change: dict[str, Any]) -> tuple[str, int]:
    return change["wiki_id"], change["page"]["page_id"]


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    return list(generate_events(EVENTS))


@pytest.fixture(scope="module")
def changes() -> list[dict[str, Any]]:
    return list(generate_page_changes(CHANGES))


@pytest.fixture(scope="module")
def distinct_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """First arrival of each event, in event-time order (stable, so per key order is arrival order
    only on equal times, which never happen within a key)."""
    seen: dict[str, dict[str, Any]] = {}
    for c in changes:
        seen.setdefault(c["meta"]["id"], c)
    return sorted(seen.values(), key=lambda c: parse_time(c["dt"]))


# ---------------------------------------------------------------------------------------------- events


def test_same_seed_gives_identical_events_and_another_seed_differs(events: list[dict[str, Any]]) -> None:
    assert list(generate_events(EVENTS)) == events
    other = list(generate_events(EventsSpec(**{**EVENTS.__dict__, "seed": EVENTS.seed + 1})))
    assert other != events
    assert {e["uuid"] for e in other}.isdisjoint(e["uuid"] for e in events)


def test_event_count_matches_spec_exactly(events: list[dict[str, Any]]) -> None:
    assert len(events) == EVENTS.events
    assert len({e["uuid"] for e in events}) == EVENTS.events


def test_every_event_has_the_required_fields_with_the_right_json_types(events: list[dict[str, Any]]) -> None:
    start = EVENTS.start
    end = start + timedelta(seconds=EVENTS.span_seconds)
    for event in json.loads(json.dumps(events)):
        assert list(event) == ["uuid", "event", "team_id", "distinct_id", "timestamp", "properties"]
        assert str(uuid.UUID(event["uuid"])) == event["uuid"]
        assert isinstance(event["event"], str) and event["event"]
        assert type(event["team_id"]) is int and 1 <= event["team_id"] <= EVENTS.teams
        assert isinstance(event["distinct_id"], str) and event["distinct_id"]
        assert event["timestamp"].endswith("Z")
        assert start <= parse_time(event["timestamp"]) < end
        assert isinstance(event["properties"], dict | str)
        assert isinstance(properties_of(event), dict)


def test_ordinary_events_carry_three_to_twelve_vocabulary_properties(events: list[dict[str, Any]]) -> None:
    reserved = {"$set", "$set_once"}
    for event in events:
        if event["event"] == "$groupidentify":
            continue
        props = properties_of(event)
        assert 3 <= len(set(props) - reserved) <= 12


def test_some_events_carry_properties_as_a_json_string(events: list[dict[str, Any]]) -> None:
    as_string = sum(isinstance(e["properties"], str) for e in events)
    assert 0.01 * len(events) < as_string < 0.04 * len(events)


def test_timestamps_mostly_increase_but_some_arrive_a_little_out_of_order(
    events: list[dict[str, Any]],
) -> None:
    times = [parse_time(e["timestamp"]) for e in events]
    backwards = sum(later < earlier for earlier, later in pairwise(times))
    assert 0 < backwards < 0.5 * len(times)
    assert times[-1] - times[0] > timedelta(seconds=0.9 * EVENTS.span_seconds)


def test_team_volume_is_skewed(events: list[dict[str, Any]]) -> None:
    per_team = Counter(e["team_id"] for e in events)
    volumes = [per_team.get(team, 0) for team in range(1, EVENTS.teams + 1)]
    assert max(volumes) >= 5 * max(1.0, statistics.median(volumes))


def test_property_values_are_skewed_within_a_key(events: list[dict[str, Any]]) -> None:
    browsers = Counter(v for e in events if isinstance(v := properties_of(e).get("$browser"), str) and v)
    (_, top), *rest = browsers.most_common()
    assert top >= 3 * rest[-1][1]


def test_person_and_group_shares_are_roughly_as_configured(events: list[dict[str, Any]]) -> None:
    n = len(events)
    person = sum(bool({"$set", "$set_once"} & set(properties_of(e))) for e in events)
    groups = sum(e["event"] == "$groupidentify" for e in events)
    assert abs(person / n - EVENTS.person_share) < 0.02
    assert abs(groups / n - EVENTS.group_share) < 0.01
    for event in events:
        props = properties_of(event)
        for field in ("$set", "$set_once"):
            if field in props:
                assert isinstance(props[field], dict) and 1 <= len(props[field]) <= 3


def test_groupidentify_events_carry_a_matching_group_type_and_index(events: list[dict[str, Any]]) -> None:
    index_of = {"project": 0, "organization": 1, "instance": 2}
    seen = set()
    for event in events:
        if event["event"] != "$groupidentify":
            continue
        props = properties_of(event)
        assert props["$group_type_index"] == index_of[props["$group_type"]]
        assert isinstance(props["$group_key"], str) and props["$group_key"]
        assert isinstance(props["$group_set"], dict) and 1 <= len(props["$group_set"]) <= 3
        seen.add(props["$group_type"])
    assert seen == set(index_of)


def test_some_property_values_hit_every_fanout_skip_rule(events: list[dict[str, Any]]) -> None:
    values = [v for e in events for v in properties_of(e).values()]
    assert any(v is None for v in values)
    assert any(isinstance(v, list) for v in values)
    assert any(v == "" for v in values)
    assert any(isinstance(v, str) and len(v) > 255 for v in values)
    odd = sum(v is None or v == "" or isinstance(v, list) for v in values)
    assert odd < 0.02 * len(values)
    kinds = {type(v) for v in values}
    assert {str, int, float, bool, dict} <= kinds


# -------------------------------------------------------------------------------------------- page changes


def test_same_seed_gives_identical_page_changes_and_another_seed_differs(
    changes: list[dict[str, Any]],
) -> None:
    assert list(generate_page_changes(CHANGES)) == changes
    other = list(generate_page_changes(PageChangesSpec(**{**CHANGES.__dict__, "seed": CHANGES.seed + 1})))
    assert other != changes


def test_page_change_count_is_changes_plus_duplicates(changes: list[dict[str, Any]]) -> None:
    ids = Counter(c["meta"]["id"] for c in changes)
    duplicates = sum(n - 1 for n in ids.values())
    assert len(ids) == CHANGES.changes
    assert max(ids.values()) == 2
    assert duplicates == round(CHANGES.changes * CHANGES.duplicate_rate)
    assert len(changes) == CHANGES.changes + duplicates


def test_every_page_change_has_the_page_change_v1_shape(changes: list[dict[str, Any]]) -> None:
    for c in json.loads(json.dumps(changes)):
        assert c["$schema"] == "/mediawiki/page/change/1.2.0"
        assert c["meta"]["stream"] == "mediawiki.page_change.v1"
        assert str(uuid.UUID(c["meta"]["id"])) == c["meta"]["id"]
        assert c["meta"]["dt"] == c["dt"] and c["dt"].endswith("Z")
        assert c["meta"]["uri"] == f"https://{c['meta']['domain']}/wiki/{c['page']['page_title']}"
        assert c["wiki_id"] in CHANGES.wikis
        assert c["page_change_kind"] in PAGE_CHANGE_KINDS
        assert c["changelog_kind"] == CHANGELOG_KIND[c["page_change_kind"]]
        assert type(c["page"]["page_id"]) is int
        assert c["page"]["namespace_id"] == 0 and c["page"]["is_redirect"] is False
        assert type(c["revision"]["rev_id"]) is int
        assert isinstance(c["revision"]["is_minor_edit"], bool)
        assert parse_time(c["revision"]["rev_dt"]) <= parse_time(c["dt"])
        start = CHANGES.start
        assert start <= parse_time(c["dt"]) < start + timedelta(seconds=CHANGES.span_seconds)


def test_every_page_starts_with_a_create(distinct_changes: list[dict[str, Any]]) -> None:
    first: dict[tuple[str, int], dict[str, Any]] = {}
    for c in distinct_changes:
        first.setdefault(key_of(c), c)
    assert {c["page_change_kind"] for c in first.values()} == {"create"}
    creates = Counter(key_of(c) for c in distinct_changes if c["page_change_kind"] == "create")
    assert set(creates.values()) == {1}


def test_rev_ids_never_decrease_per_page_in_event_time(distinct_changes: list[dict[str, Any]]) -> None:
    per_key: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for c in distinct_changes:
        per_key[key_of(c)].append(c)
    for history in per_key.values():
        times = [parse_time(c["dt"]) for c in history]
        assert times == sorted(set(times)), "event times within a page are distinct"
        rev_ids = [c["revision"]["rev_id"] for c in history]
        assert rev_ids == sorted(rev_ids)


def test_deletes_undeletes_and_visibility_changes_keep_the_current_rev_id(
    distinct_changes: list[dict[str, Any]],
) -> None:
    per_key: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for c in distinct_changes:
        per_key[key_of(c)].append(c)
    kinds = Counter(c["page_change_kind"] for c in distinct_changes)
    assert kinds["delete"] > 0 and kinds["delete"] == kinds["undelete"]
    for history in per_key.values():
        for before, after in pairwise(history):
            if after["page_change_kind"] in ("delete", "undelete", "visibility_change"):
                assert after["revision"]["rev_id"] == before["revision"]["rev_id"]
            else:
                assert after["revision"]["rev_id"] > before["revision"]["rev_id"]
            if before["page_change_kind"] == "delete":
                assert after["page_change_kind"] == "undelete"


def test_page_activity_is_skewed_with_bursts_inside_five_minutes(
    distinct_changes: list[dict[str, Any]],
) -> None:
    per_key: dict[tuple[str, int], list[datetime]] = defaultdict(list)
    for c in distinct_changes:
        per_key[key_of(c)].append(parse_time(c["dt"]))
    sizes = sorted(len(times) for times in per_key.values())
    assert sizes[-1] >= 5 * statistics.median(sizes)
    close = sum(
        later - earlier < timedelta(minutes=5) for times in per_key.values() for earlier, later in pairwise(times)
    )
    assert close > 0.2 * (len(distinct_changes) - len(per_key))


def test_duplicates_are_exact_copies_arriving_after_the_original(changes: list[dict[str, Any]]) -> None:
    first_at: dict[str, int] = {}
    copies = 0
    for position, c in enumerate(changes):
        meta_id = c["meta"]["id"]
        if meta_id in first_at:
            assert c == changes[first_at[meta_id]]
            assert json.dumps(c) == json.dumps(changes[first_at[meta_id]])
            assert c is not changes[first_at[meta_id]]
            copies += 1
        else:
            first_at[meta_id] = position
    assert copies > 0


def test_some_page_changes_arrive_out_of_event_time_order(changes: list[dict[str, Any]]) -> None:
    times = [parse_time(c["dt"]) for c in changes]
    late = sum(later < earlier for earlier, later in pairwise(times))
    assert late > 0.05 * len(changes)


def test_no_arrival_lags_the_newest_event_time_by_more_than_max_delay(changes: list[dict[str, Any]]) -> None:
    bound = timedelta(seconds=CHANGES.max_delay_seconds)
    newest = parse_time(changes[0]["dt"])
    worst = timedelta(0)
    for c in changes:
        t = parse_time(c["dt"])
        newest = max(newest, t)
        worst = max(worst, newest - t)
    assert timedelta(seconds=30) < worst <= bound


def test_zero_rates_give_distinct_events_in_event_time_order() -> None:
    spec = PageChangesSpec(pages=50, changes=300, duplicate_rate=0.0, out_of_order_rate=0.0, seed=3)
    changes = list(generate_page_changes(spec))
    assert len({c["meta"]["id"] for c in changes}) == len(changes) == 300
    times = [parse_time(c["dt"]) for c in changes]
    assert times == sorted(times)


# ---------------------------------------------------------------------------------------------- files


def test_write_jsonl_batches_is_byte_identical_across_calls(tmp_path: Path) -> None:
    spec = EventsSpec(events=1_000, teams=20, keys=40, values_per_key=20)
    first = write_jsonl_batches(generate_events(spec), tmp_path / "a", "events", 4)
    second = write_jsonl_batches(generate_events(spec), tmp_path / "b", "events", 4)
    assert [p.name for p in first] == [f"events-{i:03d}.jsonl" for i in range(4)]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_write_jsonl_batches_splits_records_in_order_into_contiguous_files(
    tmp_path: Path, changes: list[dict[str, Any]]
) -> None:
    records = changes[:1_003]
    paths = write_jsonl_batches(records, tmp_path / "nested" / "dir", "pc", 4)
    assert all(p.parent == tmp_path / "nested" / "dir" for p in paths)
    line_counts = []
    read_back: list[dict[str, Any]] = []
    for path in paths:
        data = path.read_bytes()
        assert data.endswith(b"\n")
        lines = data.decode("utf-8").split("\n")[:-1]
        line_counts.append(len(lines))
        for line in lines:
            record = json.loads(line)
            assert isinstance(record, dict)
            assert line == json.dumps(record, separators=(",", ":"), ensure_ascii=False)
            read_back.append(record)
    assert line_counts == [251, 251, 251, 250]
    assert read_back == records


def test_write_jsonl_batches_leaves_files_empty_when_batches_outnumber_records(tmp_path: Path) -> None:
    paths = write_jsonl_batches([{"a": 1}, {"b": "ü"}], tmp_path, "tiny", 3)
    assert [p.read_bytes() for p in paths] == [b'{"a":1}\n', '{"b":"ü"}\n'.encode(), b""]
    with pytest.raises(ValueError):
        write_jsonl_batches([], tmp_path, "none", 0)


def test_interleaved_batches_deal_records_round_robin(tmp_path: Path) -> None:
    records = [{"i": i} for i in range(10)]
    paths = write_jsonl_batches(records, tmp_path, "pods", 3, interleave=True)
    dealt = [[json.loads(line)["i"] for line in p.read_text().splitlines()] for p in paths]
    assert dealt == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
