"""KVCacheManager: host-side bookkeeping of the paged KV cache (which request owns which pages), with
vLLM-style automatic prefix caching.

The device holds K/V as [num_pages, page_size, ...]; a request's KV lives in the pages of its page table,
token t in page_table[t // page_size] at slot t % page_size. This module never touches device memory.

Page 0 is reserved and never handed out: the padding rows of the device's page tables (bucketed batch shapes)
point at it, so it is read but never attended to. Usable pages = num_pages - 1.

Prefix caching (enable_prefix_caching=True)
-------------------------------------------
A *full* page whose KV is known to be written can be registered under a content hash. The hash of page i
of a sequence is chained: H_i = blake2b(H_{i-1} || token ids of page i), H_{-1} = blake2b(repr(extra_key)),
where extra_key is anything else the KV depends on (KV dtype, adapter, ...). Because the chain covers every
earlier token, equal hashes mean equal KV for the whole prefix (positions included), so a new request whose
first k page hashes are cached can take those k pages instead of recomputing them. blake2b (128-bit digest,
ids packed as signed 64-bit ints) is used rather than Python's hash(): it is stable across processes and
runs and collisions are negligible, so a hit never needs to compare token ids.

Pages are reference counted (ref = number of page tables holding the page). A page is shared only through a
cache hit, so a page with ref > 1 always carries a hash. Pages a request writes to are always its own
(ref 1): hits are whole pages and the scheduler always leaves at least one token to compute, in a fresh page.

Free (ref 0) pages live in two queues, in allocation order:
  1. `_free`: pages without a hash, FIFO (deterministic reuse order);
  2. `_evictable`: pages with a cached hash, least recently freed first (LRU). They stay findable by
     lookup until allocation needs them, then they are evicted (hash dropped) front first.
Unhashed free pages are always used before any cached page is evicted. free() releases a request's pages
tail first, so among one request's pages the leaves (deepest in the hash chain, least likely to be shared)
are evicted before their parents. A page with ref > 0 is never evicted.

With enable_prefix_caching=False (the default here; the engine turns it on) nothing is ever hashed, every
page has ref 0 or 1, and the manager behaves exactly as a plain FIFO page allocator.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections import OrderedDict, deque
from typing import Callable, Hashable, Sequence

RESERVED_PAGE = 0  # padding/trash page, never owned by a request

PageHash = bytes
TokenSlice = Callable[[int, int], Sequence[int]]  # (start, stop) -> token ids [start, stop)


def hash_page(parent: PageHash, token_ids: Sequence[int]) -> PageHash:
    """Chained content hash of one full page: blake2b-128(parent hash || ids as int64)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


# An empty blake2b-128 state: KVCacheManager hashes a page by copying it (no keyword parsing per page)
_BLAKE2B_128 = hashlib.blake2b(digest_size=16)


def root_hash(extra_key: Hashable) -> PageHash:
    """The parent hash of page 0 of every sequence: binds the chain to extra_key (KV dtype, adapter, ...)."""
    return hashlib.blake2b(repr(extra_key).encode(), digest_size=16).digest()


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = False,
                 extra_key: Hashable = None) -> None:
        if not isinstance(num_pages, int) or num_pages < 2:
            raise ValueError(f"num_pages={num_pages!r} must be an int >= 2 (page 0 is reserved for padding); "
                             f"raise gpu_memory_utilization or num_pages")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size={page_size!r} must be an int >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.extra_key = extra_key
        self._root = root_hash(extra_key)
        self._free: deque[int] = deque(range(1, num_pages))   # ref-0 pages without a hash: FIFO
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref-0 pages with a hash: LRU (front = oldest)
        self._ref = [0] * num_pages                            # owners per page; page 0 stays 0 forever
        self._pages: dict[str, list[int]] = {}                 # request_id -> page table (in token order)
        # The same dict, read (never written) by Scheduler.schedule's per-request hot path: whether a request's
        # pages already cover its next tokens, and the copy of its page table, without two method calls.
        self.page_lists = self._pages
        self._page_hash: list[PageHash | None] = [None] * num_pages
        self._cached: dict[PageHash, int] = {}                 # hash -> page holding that prefix's KV
        self._num_hashed: dict[str, int] = {}                  # request_id -> leading pages already registered
        self.num_evictions = 0
        # A full page's ids as the bytes array("q", ids).tobytes() gives (int64, native byte order) without
        # array's per-item argument parsing: hash_page of a page in a third of the instructions (_hash_page)
        self._pack_page = struct.Struct(f"={page_size}q").pack

    def _hash_page(self, parent: PageHash, token_ids: Sequence[int]) -> PageHash:
        """hash_page(parent, token_ids), the same bytes (tests/engine/test_prefix_cache.py compares them)."""
        if len(token_ids) != self.page_size:
            return hash_page(parent, token_ids)
        h = _BLAKE2B_128.copy()
        h.update(parent)
        h.update(self._pack_page(*token_ids))
        return h.digest()

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def num_free_pages(self) -> int:
        """Pages allocation can hand out: unhashed free pages plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_pages(self) -> int:
        return self.num_usable_pages - self.num_free_pages

    @property
    def num_cached_pages(self) -> int:
        """Pages holding a registered hash (in use or evictable)."""
        return len(self._cached)

    @property
    def num_evictable_pages(self) -> int:
        return len(self._evictable)

    def pages_needed(self, num_tokens: int) -> int:
        """Pages to hold num_tokens tokens: ceil(num_tokens / page_size)."""
        return -(-num_tokens // self.page_size)

    def can_fit_ever(self, num_tokens: int) -> bool:
        """Could a request of num_tokens tokens fit an otherwise empty cache?"""
        return self.pages_needed(num_tokens) <= self.num_usable_pages

    # ---- hashing / lookup --------------------------------------------------------------------------
    def extend_hashes(self, hashes: list[PageHash], tokens: TokenSlice, num_full_pages: int) -> None:
        """Append to `hashes` (a sequence's page-hash chain) the hashes of its full pages up to num_full_pages.
        tokens(start, stop) must return the sequence's (known) token ids in [start, stop)."""
        ps = self.page_size
        parent = hashes[-1] if hashes else self._root
        for i in range(len(hashes), num_full_pages):
            parent = self._hash_page(parent, tokens(i * ps, (i + 1) * ps))
            hashes.append(parent)

    def lookup(self, hashes: list[PageHash], tokens: TokenSlice, max_pages: int) -> list[int]:
        """The pages of the longest cached prefix (at most max_pages pages) of a sequence. Computes missing
        hashes into `hashes` lazily and stops at the first miss. Takes nothing (see allocate)."""
        if not self.enable_prefix_caching or max_pages <= 0:
            return []
        ps = self.page_size
        hit: list[int] = []
        for i in range(max_pages):
            if i == len(hashes):
                parent = hashes[-1] if hashes else self._root
                hashes.append(self._hash_page(parent, tokens(i * ps, (i + 1) * ps)))
            page = self._cached.get(hashes[i])
            if page is None:
                break
            hit.append(page)
        return hit

    def cache_pages(self, request_id: str, hashes: list[PageHash], tokens: TokenSlice, num_full_pages: int) -> None:
        """Register request_id's first num_full_pages pages as cached (their KV is computed and written).

        Only call this for pages whose tokens are all known and whose computing step has completed. A page
        whose hash is already held by another page (the same prefix computed twice concurrently) stays
        unhashed: it is freed as a plain page."""
        if not self.enable_prefix_caching:
            return
        done = self._num_hashed.get(request_id, 0)
        if num_full_pages <= done:
            return
        table = self._pages.get(request_id)
        if table is None:
            return
        num_full_pages = min(num_full_pages, len(table))
        self.extend_hashes(hashes, tokens, num_full_pages)
        for i in range(done, num_full_pages):
            page, h = table[i], hashes[i]
            if self._page_hash[page] is None and h not in self._cached:
                self._page_hash[page] = h
                self._cached[h] = page
        self._num_hashed[request_id] = max(done, num_full_pages)

    def cache_pages_each(self, items) -> None:
        """cache_pages(request_id, hashes, tokens, num_full_pages) for each tuple of `items`, in order, in one call
        (the decode run's filled pages: ~16 a step at batch 256 with 16-token pages); the usual case, one new
        page after the hashed ones, inline."""
        if not self.enable_prefix_caching:
            return
        ps, num_hashed, tables, page_hash, cached = self.page_size, self._num_hashed, self._pages, self._page_hash, \
            self._cached
        hash_one = self._hash_page
        for rid, hashes, tokens, n in items:
            done = num_hashed.get(rid, 0)
            table = tables.get(rid)
            if n != done + 1 or table is None or n > len(table) or len(hashes) != done:
                self.cache_pages(rid, hashes, tokens, n)     # the general form (nothing, or several pages)
                continue
            h = hash_one(hashes[-1] if hashes else self._root, tokens(done * ps, n * ps))
            hashes.append(h)
            page = table[done]
            if page_hash[page] is None and h not in cached:
                page_hash[page] = h
                cached[h] = page
            num_hashed[rid] = n

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (e.g. after new weights). Pages in use keep their KV, unshared."""
        if any(self._ref[p] > 1 for p in range(self.num_pages)):
            raise RuntimeError("cannot reset the prefix cache while requests share cached pages")
        for p in range(self.num_pages):
            self._page_hash[p] = None
        self._cached.clear()
        self._free.extend(self._evictable)
        self._evictable.clear()

    # ---- per request -------------------------------------------------------------------------------
    def allocate(self, request_id: str, num_tokens_total: int, cached_pages: Sequence[int] = ()) -> list[int] | None:
        """Grow request_id's page list so it covers num_tokens_total tokens.

        cached_pages (only when the request holds no pages yet): pages returned by lookup(), taken first as
        the start of the page table (ref count + 1; an evictable one leaves the free queue), covering the
        first len(cached_pages) * page_size tokens. New pages come from the unhashed free queue first, then
        by evicting the least recently freed cached pages.

        Returns the pages newly taken (cached pages included; possibly [] when the current pages already
        suffice — test the result with `is None`, not truthiness), or None when there are not enough free
        pages, in which case nothing changes. The page list never shrinks here; use free().
        """
        if num_tokens_total < 0:
            raise ValueError(f"num_tokens_total={num_tokens_total} must be >= 0")
        have = self._pages.get(request_id)
        if have is not None and not cached_pages and num_tokens_total <= len(have) * self.page_size:
            return []  # the pages held already cover it: most decode steps of most requests (hot path)
        num_have = len(have) if have is not None else 0
        if cached_pages:
            assert have is None, f"cached pages for {request_id!r}, which already holds pages"
            assert len(set(cached_pages)) == len(cached_pages)
            for p in cached_pages:
                assert self._page_hash[p] is not None, f"page {p} is not cached"
        num_cached = len(cached_pages)
        num_new = self.pages_needed(num_tokens_total) - num_have - num_cached
        if num_new <= 0 and not num_cached:
            return []
        num_new = max(num_new, 0)
        # cached pages that are free right now leave the free pool when taken
        available = self.num_free_pages - sum(1 for p in cached_pages if self._ref[p] == 0)
        if num_new > available:
            return None
        for p in cached_pages:
            if self._ref[p] == 0:
                del self._evictable[p]
            self._ref[p] += 1
        new = [self._pop_free() for _ in range(num_new)]
        for p in new:
            assert p != RESERVED_PAGE and self._ref[p] == 0, f"page {p} handed out while owned (ref {self._ref[p]})"
            self._ref[p] = 1
        if have is None:
            self._pages[request_id] = list(cached_pages) + new
            self._num_hashed[request_id] = num_cached
        else:
            have.extend(new)
        return list(cached_pages) + new

    def append_page_each(self, request_ids: Sequence[str]) -> None:
        """One more page for each of request_ids (each holds pages already), in order: what allocate(rid, (pages +
        1) * page_size) does for each, in one call (the decode run's page crossings: ~16 a step at batch 256 with
        16-token pages). Raises, changing nothing, if fewer pages are free than asked for."""
        if len(request_ids) > self.num_free_pages:
            raise RuntimeError(f"{len(request_ids)} pages asked for, {self.num_free_pages} free")
        pages, ref = self._pages, self._ref
        for rid in request_ids:
            p = self._pop_free()
            assert p != RESERVED_PAGE and ref[p] == 0, f"page {p} handed out while owned (ref {ref[p]})"
            ref[p] = 1
            pages[rid].append(p)

    def _pop_free(self) -> int:
        if self._free:
            return self._free.popleft()
        page, _ = self._evictable.popitem(last=False)  # least recently freed cached page
        del self._cached[self._page_hash[page]]
        self._page_hash[page] = None
        self.num_evictions += 1
        return page

    def page_table(self, request_id: str) -> list[int]:
        """A copy of request_id's pages in token order ([] if it holds none)."""
        return list(self._pages.get(request_id, ()))

    def num_pages_of(self, request_id: str) -> int:
        return len(self._pages.get(request_id, ()))

    def free(self, request_id: str) -> None:
        """Release all of request_id's pages (no-op if it holds none).

        Ref counts drop by one; a page reaching 0 goes to the back of the unhashed free queue, or, if it
        holds a cached hash, to the back of the evictable LRU queue. Pages are released tail-first (reverse
        token order), as vLLM does, so a sequence's leaves are evicted before its shared prefix pages.
        """
        self._num_hashed.pop(request_id, None)
        pages = self._pages.pop(request_id, None)
        if pages:
            self._release(pages)

    def truncate(self, request_id: str, num_tokens: int) -> int:
        """Shrink request_id's page list to the pages holding its first num_tokens tokens, releasing the rest
        tail first like free() (speculative decoding: pages that held only rejected draft tokens). Returns the
        number of pages released. Pages past num_tokens were never registered in the prefix cache (only full
        pages of computed, accepted tokens are), so they go back to the unhashed free queue."""
        pages = self._pages.get(request_id)
        if not pages:
            return 0
        keep = max(self.pages_needed(num_tokens), 1)  # an empty page list is never kept (see free())
        if keep >= len(pages):
            return 0
        released = pages[keep:]
        del pages[keep:]
        self._num_hashed[request_id] = min(self._num_hashed.get(request_id, 0), keep)
        self._release(released)
        return len(released)

    def _release(self, pages: list[int]) -> None:
        """Drop one reference to each page, tail first; a page reaching 0 goes to the back of the unhashed free
        queue, or, if it holds a cached hash, to the back of the evictable LRU queue."""
        for p in reversed(pages):
            assert self._ref[p] >= 1, f"page {p} released with ref count {self._ref[p]}"
            self._ref[p] -= 1
            if self._ref[p] == 0:
                if self._page_hash[p] is None:
                    self._free.append(p)
                else:
                    self._evictable[p] = None

    # ---- debugging / tests -------------------------------------------------------------------------
    def free_pages(self) -> list[int]:
        """All free pages in allocation order (copy): unhashed FIFO, then evictable cached pages LRU."""
        return list(self._free) + list(self._evictable)

    def evictable_pages(self) -> list[int]:
        """Free pages holding a cached hash, in eviction order (copy)."""
        return list(self._evictable)

    def page_hash(self, page: int) -> PageHash | None:
        return self._page_hash[page]

    def ref_count(self, page: int) -> int:
        return self._ref[page]

    def owners(self) -> dict[str, list[int]]:
        """request_id -> page table (copies)."""
        return {rid: list(p) for rid, p in self._pages.items()}

    def check_invariants(self) -> None:
        """Raise AssertionError if any page is leaked, wrongly shared or double-free, ref counts or the hash
        index are inconsistent, or page 0 is used."""
        counts: dict[int, int] = {}
        for pages in self._pages.values():
            assert len(set(pages)) == len(pages), "a page appears twice in one page table"
            for p in pages:
                counts[p] = counts.get(p, 0) + 1
        owned = set(counts)
        free = list(self._free) + list(self._evictable)
        assert RESERVED_PAGE not in owned and RESERVED_PAGE not in free, "reserved page 0 handed out"
        assert len(set(free)) == len(free), "a page is in the free queues twice"
        assert not owned & set(free), "a page is both free and owned"
        assert len(owned) + len(free) == self.num_usable_pages, (
            f"leak: {len(owned)} owned + {len(free)} free != {self.num_usable_pages} usable")
        for p in range(self.num_pages):
            want = counts.get(p, 0)
            assert self._ref[p] == want, f"page {p} ref count {self._ref[p]} != {want}"
            if want > 1:
                assert self._page_hash[p] is not None, f"page {p} shared by {want} requests without a hash"
        assert all(self._page_hash[p] is None for p in self._free), "a hashed page in the unhashed free queue"
        assert all(self._page_hash[p] is not None for p in self._evictable), "an unhashed page in the LRU queue"
        for h, p in self._cached.items():
            assert self._page_hash[p] == h, f"hash index points at page {p}, which holds another hash"
        assert sum(h is not None for h in self._page_hash) == len(self._cached), "hashed page not indexed"
        if not self.enable_prefix_caching:
            assert not self._cached and all(c == 1 for c in counts.values())
        assert all(pages for pages in self._pages.values()), "empty page list kept"
        assert set(self._num_hashed) <= set(self._pages), "hash progress kept for a request without pages"
