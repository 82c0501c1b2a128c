"""Progress in commit info (tables by name): what a commit carries forward, and how the newest
commits are read back, written out by hand."""

from __future__ import annotations

import json

from pipelines.storage.commit_progress import PROGRESS_KEY, Entry, commit_metadata, merged


def test_a_commit_records_its_app_id_and_carries_every_entry_but_landed_files() -> None:
    carried = {"flow/a": Entry(7, 3), "file/x": Entry(0, 4, once=True), "flow/b": Entry(2, 5)}
    metadata = json.loads(commit_metadata("flow/b", 9, False, carried))
    assert metadata == {PROGRESS_KEY: {"flow/a": [7, 3], "flow/b": [9, None]}}
    assert json.loads(commit_metadata("file/y", 0, True, {}))[PROGRESS_KEY] == {"file/y": [0, None, 1]}


def test_the_entry_set_last_wins_whoever_carried_an_older_one() -> None:
    # Writers A and B read version 10; A commits 11 (a=5), then B commits 12 carrying a=4 from 10.
    commits = [
        (10, commit_metadata("a", 4, False, {})),
        (11, commit_metadata("a", 5, False, {"b": Entry(1, 9)})),
        (12, commit_metadata("b", 2, False, {"a": Entry(4, 10)})),
        (13, '{"not": "ours"}'),
        (14, None),
    ]
    assert merged(reversed(commits)) == {"a": Entry(5, 11), "b": Entry(2, 12)}
    assert merged(commits[2:]) == {"a": Entry(4, 10), "b": Entry(2, 12)}  # 11 outside the window read
