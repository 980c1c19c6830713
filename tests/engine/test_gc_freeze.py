"""engine/gc_freeze.py: objects alive on entry are exempt from cyclic GC inside the block and collectable after."""
import gc
import weakref

from jaxinfer.engine.gc_freeze import LOOP_GEN0_THRESHOLD, startup_objects_frozen


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
    """A freeze made outside stays: the object frozen before the block is still in the permanent generation
    after it (gc.get_objects() lists the collected generations only). Checked by identity, not by the freeze
    count, which other threads of the process (a pytest-xdist worker's) lower as frozen objects die."""
    mine = _Node()
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0 and not any(o is mine for o in gc.get_objects())
        with startup_objects_frozen():
            pass
        assert gc.get_freeze_count() > 0
        assert not any(o is mine for o in gc.get_objects())  # not unfrozen by the block
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())


def test_unfreezes_when_the_block_raises():
    try:
        with startup_objects_frozen():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0


def test_young_threshold_raised_inside_and_restored_after():
    """Fewer young collections while the loop runs (a streaming step at batch 256 allocates ~1,400 objects):
    the threshold is LOOP_GEN0_THRESHOLD inside, what it was after (also when the block raises), and a larger
    one set by the caller is never lowered."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with startup_objects_frozen():
            assert gc.get_threshold() == (LOOP_GEN0_THRESHOLD, 10, 10)
            runs = []
            track = lambda phase, info: runs.append(info["generation"]) if phase == "start" else None  # noqa: E731
            gc.callbacks.append(track)
            try:
                gc.collect(0)  # (from an empty young generation)
                runs.clear()
                junk = [[i] for i in range(5 * 700)]  # five default thresholds' worth of containers
            finally:
                gc.callbacks.remove(track)
            assert runs == [] and len(junk) == 3500  # no collection ran (under 700: five would have)
        assert gc.get_threshold() == (700, 10, 10)
        try:
            with startup_objects_frozen():
                raise KeyError("x")
        except KeyError:
            pass
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 10, 10)
        with startup_objects_frozen():
            assert gc.get_threshold()[0] == 50_000
        assert gc.get_threshold() == (50_000, 10, 10)
    finally:
        gc.set_threshold(*before)
