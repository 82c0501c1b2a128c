"""startup_heap_frozen and garbage_collected_after: what is alive on entry is out of the collector's
walks, until the exit."""

from __future__ import annotations

import gc
import weakref

from pipelines.runtime.runner import garbage_collected_after, startup_heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_start_up_heap_is_left_alone_in_the_block_and_collected_after_it() -> None:
    assert gc.get_freeze_count() == 0
    old = Node()
    gone = weakref.ref(old)
    with startup_heap_frozen():
        assert gc.get_freeze_count() > 0
        assert not tracked(old)  # a collection in here does not walk it
        new = Node()
        assert tracked(new)
        del old
        gc.collect()
        assert gone() is not None  # frozen: dropped, yet not collected in the block
        new_gone = weakref.ref(new)
        del new
        gc.collect()
        assert new_gone() is None  # what the block made is collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_a_heap_the_caller_froze_stays_frozen() -> None:
    gc.freeze()
    try:
        with startup_heap_frozen():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_job_s_cyclic_garbage_is_collected_when_it_ends_and_the_heap_before_it_is_left() -> None:
    assert gc.get_freeze_count() == 0
    before = Node()
    before_gone = weakref.ref(before)
    with garbage_collected_after():
        assert not tracked(before)  # the job's collections do not walk it
        made = Node()
        made_gone = weakref.ref(made)
        del made, before
    assert made_gone() is None  # collected as the job ended, with no collection of the caller's
    assert gc.get_freeze_count() == 0  # and the heap is whole again
    assert before_gone() is not None  # garbage from before the job waits for a full collection
    gc.collect()
    assert before_gone() is None


def test_a_job_in_a_heap_the_caller_froze_leaves_it_frozen() -> None:
    kept = Node()
    with startup_heap_frozen():
        with garbage_collected_after():
            made = Node()
            made_gone = weakref.ref(made)
            del made
        assert made_gone() is None
        assert gc.get_freeze_count() > 0
        assert not tracked(kept)  # still frozen: the job did not thaw the caller's heap
