"""engine/gc_freeze.py: objects alive on entry are exempt from cyclic GC inside the block and collectable after."""
import gc
import weakref

from jaxinfer.engine.gc_freeze import startup_objects_frozen


class _Node:
    pass


def _cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a


def test_frozen_inside_and_collected_after():
    assert gc.get_freeze_count() == 0
    a = _cycle()
    ref = weakref.ref(a)
    with startup_objects_frozen():
        assert gc.get_freeze_count() > 0
        del a  # garbage now, but frozen: a full collection must not free it
        gc.collect()
        assert ref() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None  # unfrozen on exit: nothing leaks


def test_leaves_an_outside_freeze_alone():
    gc.freeze()
    try:
        n = gc.get_freeze_count()
        with startup_objects_frozen():
            pass
        assert gc.get_freeze_count() == n  # not unfrozen by the block
    finally:
        gc.unfreeze()


def test_unfreezes_when_the_block_raises():
    try:
        with startup_objects_frozen():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
