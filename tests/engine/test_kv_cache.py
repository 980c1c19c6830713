"""KVCacheManager: exact page ids, FIFO reuse order, reserved page 0, all-or-nothing allocation."""

import ast
import sys

import pytest

from jaxinfer.engine.kv_cache import KVCacheManager


def test_engine_host_code_does_not_import_jax():
    # AST check (not sys.modules: the top-level jaxinfer package may import jax itself).
    import jaxinfer.engine.kv_cache, jaxinfer.engine.request, jaxinfer.engine.scheduler  # noqa: F401
    for mod in ("jaxinfer.engine.kv_cache", "jaxinfer.engine.request", "jaxinfer.engine.scheduler"):
        tree = ast.parse(open(sys.modules[mod].__file__).read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] != "jax", f"{mod} imports {name}"
                if name.startswith("jaxinfer."):  # only other host-only engine modules
                    assert name.startswith("jaxinfer.engine."), f"{mod} imports {name}"


def test_sizes_and_page_zero_reserved():
    kv = KVCacheManager(num_pages=8, page_size=4)
    assert kv.num_usable_pages == 7
    assert kv.num_free_pages == 7 and kv.num_used_pages == 0
    assert kv.free_pages() == [1, 2, 3, 4, 5, 6, 7]
    assert kv.pages_needed(0) == 0 and kv.pages_needed(1) == 1 and kv.pages_needed(4) == 1
    assert kv.pages_needed(5) == 2
    assert kv.can_fit_ever(28) and not kv.can_fit_ever(29)


def test_allocate_hands_out_pages_in_order_and_grows():
    kv = KVCacheManager(num_pages=8, page_size=4)
    assert kv.allocate("a", 5) == [1, 2]
    assert kv.allocate("b", 1) == [3]
    assert kv.allocate("a", 8) == []            # still fits in its 2 pages
    assert kv.allocate("a", 9) == [4]           # grows by one page
    assert kv.page_table("a") == [1, 2, 4]
    assert kv.page_table("b") == [3]
    assert kv.page_table("nobody") == []
    assert kv.num_free_pages == 3 and kv.num_used_pages == 4
    assert kv.allocate("c", 0) == [] and kv.page_table("c") == []
    kv.check_invariants()


def test_free_returns_pages_tail_first_fifo_reuse():
    kv = KVCacheManager(num_pages=6, page_size=2)
    assert kv.allocate("a", 6) == [1, 2, 3]
    assert kv.allocate("b", 4) == [4, 5]
    assert kv.free_pages() == []
    kv.free("a")
    assert kv.free_pages() == [3, 2, 1]
    assert kv.page_table("a") == []
    kv.free("b")
    assert kv.free_pages() == [3, 2, 1, 5, 4]
    assert kv.allocate("c", 3) == [3, 2]
    assert kv.allocate("d", 6) == [1, 5, 4]
    kv.free("unknown")                           # no-op
    kv.check_invariants()
    assert all(kv.ref_count(p) == 1 for p in range(1, 6)) and kv.ref_count(0) == 0


def test_allocation_failure_leaves_state_unchanged():
    kv = KVCacheManager(num_pages=5, page_size=4)   # 4 usable pages
    assert kv.allocate("a", 8) == [1, 2]
    before = (kv.free_pages(), kv.owners(), [kv.ref_count(p) for p in range(5)])
    assert kv.allocate("b", 12) is None             # needs 3, only 2 free
    assert kv.allocate("a", 17) is None             # needs 5 total (3 more)
    assert (kv.free_pages(), kv.owners(), [kv.ref_count(p) for p in range(5)]) == before
    assert kv.allocate("b", 8) == [3, 4]            # exactly fits
    assert kv.allocate("c", 1) is None
    kv.check_invariants()


def test_page_zero_never_handed_out_under_churn():
    kv = KVCacheManager(num_pages=4, page_size=1)
    for step in range(50):
        rid = f"r{step}"
        pages = kv.allocate(rid, 1 + step % 3)
        assert pages is not None and 0 not in pages
        kv.check_invariants()
        kv.free(rid)
    assert sorted(kv.free_pages()) == [1, 2, 3]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_pages=1"):
        KVCacheManager(num_pages=1, page_size=16)
    with pytest.raises(ValueError, match="page_size=0"):
        KVCacheManager(num_pages=4, page_size=0)
    with pytest.raises(ValueError, match="num_tokens_total=-1"):
        KVCacheManager(num_pages=4, page_size=4).allocate("a", -1)


def test_batched_page_calls_equal_the_per_request_ones():
    """append_page_each / cache_pages_each (the decode run's page crossings and filled pages in one call each) leave
    the manager as allocate / cache_pages called request by request do: pages, free queue, hashes, what each request
    has registered; including the general cases cache_pages_each hands back (no new page, two, an unknown id)."""
    def state(kv):
        return (sorted(kv.page_lists.items()), kv.free_pages(), kv.evictable_pages(),
                [kv.page_hash(p) for p in range(kv.num_pages)], dict(kv._num_hashed))

    toks = {r: list(range(10 * i, 10 * i + 12)) for i, r in enumerate("abc")}
    one, many = (KVCacheManager(num_pages=16, page_size=4, enable_prefix_caching=True) for _ in range(2))
    hashes = {kv: {r: [] for r in toks} for kv in (one, many)}
    for kv in (one, many):
        for r in toks:
            kv.allocate(r, 4)
    one.allocate("a", 8), one.allocate("c", 8)
    many.append_page_each(["a", "c"])
    assert state(one) == state(many)
    for n in (1, 2):   # one page each (inline), then a second one
        for r in toks:
            one.cache_pages(r, hashes[one][r], lambda s, e, r=r: toks[r][s:e], n)
        many.cache_pages_each([(r, hashes[many][r], lambda s, e, r=r: toks[r][s:e], n) for r in toks])
        assert state(one) == state(many) and hashes[one] == hashes[many]
    one.allocate("a", 12)
    many.append_page_each(["a"])
    for kv in (one, many):   # b: nothing new (general form); a: its third page, inline; an unknown id
        items = [("b", hashes[kv]["b"], lambda s, e: toks["b"][s:e], 1),
                 ("a", hashes[kv]["a"], lambda s, e: toks["a"][s:e], 3),
                 ("nobody", [], lambda s, e: [], 1)]
        if kv is one:
            for it in items:
                kv.cache_pages(*it)
        else:
            kv.cache_pages_each(items)
    assert state(one) == state(many) and hashes[one] == hashes[many]
    before = state(many)
    with pytest.raises(RuntimeError, match=f"{many.num_free_pages + 1} pages asked for"):
        many.append_page_each(["b"] * (many.num_free_pages + 1))
    assert state(many) == before
    many.check_invariants()
