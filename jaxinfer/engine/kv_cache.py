"""KVCacheManager: host-side bookkeeping of the paged KV cache (which request owns which pages).

The device holds K/V as [num_pages, page_size, ...]; a request's KV lives in the pages of its page table,
token t in page_table[t // page_size] at slot t % page_size. This module never touches device memory.

Page 0 is reserved and never handed out: the device writes the KV of padding tokens (bucketed batch
shapes) into page 0, so it is a trash page. Usable pages = num_pages - 1.

Free pages sit in a FIFO deque (deterministic reuse order). Each page has a reference count (0 = free,
1 = owned by one request). Prefix caching can be added later by giving full pages a content hash and
letting several requests share a page (ref count > 1); freed hashed pages would then stay in the free
queue as evictable cache entries. That is not implemented: today a page is owned by at most one request,
and the ref counts exist to assert exactly that.
"""

from __future__ import annotations

from collections import deque

RESERVED_PAGE = 0  # padding/trash page, never owned by a request


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if not isinstance(num_pages, int) or num_pages < 2:
            raise ValueError(f"num_pages={num_pages!r} must be an int >= 2 (page 0 is reserved for padding); "
                             f"raise gpu_memory_utilization or num_pages")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size={page_size!r} must be an int >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(1, num_pages))   # FIFO: popleft to allocate, append to free
        self._ref = [0] * num_pages                            # owners per page; page 0 stays 0 forever
        self._pages: dict[str, list[int]] = {}                 # request_id -> page table (in token order)

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        return self.num_usable_pages - len(self._free)

    def pages_needed(self, num_tokens: int) -> int:
        """Pages to hold num_tokens tokens: ceil(num_tokens / page_size)."""
        return -(-num_tokens // self.page_size)

    def can_fit_ever(self, num_tokens: int) -> bool:
        """Could a request of num_tokens tokens fit an otherwise empty cache?"""
        return self.pages_needed(num_tokens) <= self.num_usable_pages

    # ---- per request -------------------------------------------------------------------------------
    def allocate(self, request_id: str, num_tokens_total: int) -> list[int] | None:
        """Grow request_id's page list so it covers num_tokens_total tokens.

        Returns the pages newly added (possibly [] when the current pages already suffice — test the
        result with `is None`, not truthiness), or None when there are not enough free pages, in which
        case nothing changes. The page list never shrinks here; use free().
        """
        if num_tokens_total < 0:
            raise ValueError(f"num_tokens_total={num_tokens_total} must be >= 0")
        have = self._pages.get(request_id)
        num_have = len(have) if have is not None else 0
        num_new = self.pages_needed(num_tokens_total) - num_have
        if num_new <= 0:
            return []
        if num_new > len(self._free):
            return None
        new = [self._free.popleft() for _ in range(num_new)]
        for p in new:
            assert p != RESERVED_PAGE and self._ref[p] == 0, f"page {p} handed out while owned (ref {self._ref[p]})"
            self._ref[p] = 1
        if have is None:
            self._pages[request_id] = new
        else:
            have.extend(new)
        return list(new)

    def page_table(self, request_id: str) -> list[int]:
        """A copy of request_id's pages in token order ([] if it holds none)."""
        return list(self._pages.get(request_id, ()))

    def num_pages_of(self, request_id: str) -> int:
        return len(self._pages.get(request_id, ()))

    def free(self, request_id: str) -> None:
        """Return all of request_id's pages to the free queue (no-op if it holds none).

        Pages are appended tail-first (reverse token order), as vLLM does: with prefix caching the free
        queue doubles as the eviction order, and a sequence's tail pages are the least likely to be shared.
        """
        pages = self._pages.pop(request_id, None)
        if not pages:
            return
        for p in reversed(pages):
            assert self._ref[p] == 1, f"page {p} freed with ref count {self._ref[p]}"
            self._ref[p] = 0
            self._free.append(p)

    # ---- debugging / tests -------------------------------------------------------------------------
    def free_pages(self) -> list[int]:
        """The free queue in allocation order (copy)."""
        return list(self._free)

    def ref_count(self, page: int) -> int:
        return self._ref[page]

    def owners(self) -> dict[str, list[int]]:
        """request_id -> page table (copies)."""
        return {rid: list(p) for rid, p in self._pages.items()}

    def check_invariants(self) -> None:
        """Raise AssertionError if any page is leaked, double-owned or double-free, or page 0 is used."""
        owned = [p for pages in self._pages.values() for p in pages]
        free = list(self._free)
        assert RESERVED_PAGE not in owned and RESERVED_PAGE not in free, "reserved page 0 handed out"
        assert len(set(owned)) == len(owned), "a page is owned twice"
        assert len(set(free)) == len(free), "a page is in the free queue twice"
        assert not set(owned) & set(free), "a page is both free and owned"
        assert len(owned) + len(free) == self.num_usable_pages, (
            f"leak: {len(owned)} owned + {len(free)} free != {self.num_usable_pages} usable")
        owned_set = set(owned)
        for p in range(self.num_pages):
            want = 1 if p in owned_set else 0
            assert self._ref[p] == want, f"page {p} ref count {self._ref[p]} != {want}"
        assert all(pages for pages in self._pages.values()), "empty page list kept"
