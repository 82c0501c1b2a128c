"""startup_heap_frozen: what is alive on entry is out of the collector's walks, until the exit."""

from __future__ import annotations

import gc
import weakref

from pipelines.runner import startup_heap_frozen


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
