"""The paged KV cache's bookkeeping: block pools, block tables and the prefix cache.

Each KV group (layers with the same attention window) has its own pool of fixed-size blocks,
sized by `inferd.memory.kv.plan_kv_pool`. A sequence owns one block table per group.

Prefix caching: a full block is named by the chained sha256 of its tokens (`block_hash`), so two
sequences whose prompts start alike find the same blocks and share them by reference count.
A block whose count drops to zero goes to the pool's free list but keeps its contents and hash
until it is handed out again: free blocks are reused least-recently-freed first, so popular
prefixes survive. Within one sequence the tail is freed first, so it is also evicted first.

Sliding windows: a sliding layer at position p only reads keys after p - window, so its group
releases blocks that fell out of the window (their table entries become the null block 0). A
long prompt therefore holds about `window` tokens of sliding-layer KV instead of its whole
length; for Gemma 3 (15 of 18 layers slide over 512 tokens) that is most of the KV memory.
For a prefix-cache hit a sliding group needs only the blocks inside the window before the first
token to compute, and the hit is shortened until every group has what it needs.
"""

from __future__ import annotations

from collections import OrderedDict

from inferd.engine.scheduling.request import Sequence
from inferd.memory.kv import NULL_BLOCKS

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks, self.enable_caching = num_blocks, enable_caching
        self.ref = [0] * num_blocks
        self.ref[NULL_BLOCK] = 1  # never handed out
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        # Free blocks, first = reused first. Cached ones go to the end, uncached to the front.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(NULL_BLOCKS, num_blocks))
        # Blocks never handed out hold whatever the allocator left there; the runner zeroes
        # each on first use (`fresh`), so stale slots are always finite numbers. (A byte per
        # block: a set of tens of thousands of ints would hold megabytes.)
        self.untouched = bytearray(b"\1" * num_blocks)
        self.untouched[:NULL_BLOCKS] = bytes(NULL_BLOCKS)
        self.fresh: list[int] = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / max(1, self.num_blocks - NULL_BLOCKS)

    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks; the caller checked `num_free`."""
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            h = self.hash_of[block]
            if h is not None:  # evict: its old contents are about to be overwritten
                if self.cached.get(h) == block:
                    del self.cached[h]
                self.hash_of[block] = None
            self.ref[block] = 1
            if self.untouched[block]:
                self.untouched[block] = 0
                self.fresh.append(block)
            out.append(block)
        return out

    def share(self, block: int) -> None:
        """Take one more reference to a block found in the prefix cache (or forked)."""
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None
                if self.hash_of[block] is None:
                    self.free.move_to_end(block, last=False)

    def register(self, block: int, h: bytes) -> bool:
        """Name a computed block; False when it was named already (or another block has
        that name)."""
        if self.enable_caching and self.hash_of[block] is None and h not in self.cached:
            self.cached[h] = block
            self.hash_of[block] = h
            return True
        return False

    def unregister(self, block: int) -> None:
        h = self.hash_of[block]
        if h is not None and self.cached.get(h) == block:
            del self.cached[h]
        self.hash_of[block] = None

    def lookup(self, h: bytes) -> int | None:
        return self.cached.get(h)

    def reset_cache(self) -> None:
        """Forget every cached hash (e.g. after a weights change); blocks in use are kept."""
        self.cached.clear()
        self.hash_of = [None] * self.num_blocks

    def forget_contents(self) -> None:
        """The pool's memory was freed and allocated anew (a sleep: engine/core/sleep_mode.py):
        no block holds what it held, so nothing is cached and every block is zeroed again on
        its first use, as at start. Only for a pool no sequence holds blocks of."""
        self.reset_cache()
        self.untouched = bytearray(b"\1" * self.num_blocks)
        self.untouched[:NULL_BLOCKS] = bytes(NULL_BLOCKS)
        self.fresh = []


class KVCacheManager:
    def __init__(
        self,
        windows: list[int | None],  # per KV group
        num_blocks: list[int],
        block_size: int,
        enable_prefix_caching: bool,
    ):
        self.windows, self.block_size = windows, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pools = [BlockPool(n, enable_prefix_caching) for n in num_blocks]

    # ---- queries ----------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return max(p.usage for p in self.pools)

    def _first_needed_block(self, group: int, position: int) -> int:
        """First block a layer of `group` reads when computing the token at `position`."""
        window = self.windows[group]
        if window is None:
            return 0
        return max(0, position - window + 1) // self.block_size

    def max_blocks_needed(self, num_tokens: int) -> int:
        """Most blocks one sequence of `num_tokens` tokens holds in its largest group."""
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> tuple[int, list[list[int]]]:
        """(tokens served from cache, per-group block tables for them). Takes no references."""
        if not self.enable_prefix_caching:
            return 0, [[] for _ in self.pools]
        hashes = seq.block_hashes
        # Leave at least one token to compute: its logits are needed to continue.
        k = min(len(hashes), (seq.num_tokens - 1) // self.block_size)
        for g, pool in enumerate(self.pools):
            if self.windows[g] is None:
                n = 0
                while n < k and pool.lookup(hashes[n]) is not None:
                    n += 1
                k = n
        while k > 0:
            tables = self._tables_for_hit(k, hashes)
            if tables is not None:
                return k * self.block_size, tables
            k -= 1
        return 0, [[] for _ in self.pools]

    def _tables_for_hit(self, k: int, hashes: list[bytes]) -> list[list[int]] | None:
        """Per-group tables for a hit of k blocks, or None if some group lacks a block."""
        tables = []
        for g, pool in enumerate(self.pools):
            first = self._first_needed_block(g, k * self.block_size)
            table = [NULL_BLOCK] * first
            for i in range(first, k):
                block = pool.lookup(hashes[i])
                if block is None:
                    return None
                table.append(block)
            tables.append(table)
        return tables

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        prefix: tuple[int, list[list[int]]] | None = None,
    ) -> bool:
        """Make the block tables of `seq` cover `num_new_tokens` more tokens (after taking the
        cached `prefix`, if given). Returns False, changing nothing, when a pool is short."""
        if prefix is not None and prefix[0] > 0:
            tables = [list(t) for t in prefix[1]]
            computed = prefix[0]
        else:
            tables = seq.block_tables or [[] for _ in self.pools]
            computed = seq.num_computed
        end = computed + num_new_tokens
        needs = []
        for g, pool in enumerate(self.pools):
            table = tables[g]
            # Cached blocks nobody holds sit in the free list: taking them uses it up too.
            revived = sum(1 for b in table if b != NULL_BLOCK and pool.ref[b] == 0)
            revived = revived if prefix is not None else 0
            first = self._first_needed_block(g, computed)
            live_needed = max(0, self.max_blocks_needed(end) - max(len(table), first))
            needs.append(live_needed)
            if live_needed + revived > pool.num_free:
                return False
        for g, pool in enumerate(self.pools):
            table = tables[g]
            if prefix is not None:
                for b in table:
                    if b != NULL_BLOCK:
                        pool.share(b)
            # Release blocks that left this group's window.
            first = self._first_needed_block(g, computed)
            dropped = [b for b in table[:first] if b != NULL_BLOCK]
            if dropped:
                pool.release(dropped)
                table[: min(first, len(table))] = [NULL_BLOCK] * min(first, len(table))
            if len(table) < first:
                table.extend([NULL_BLOCK] * (first - len(table)))
            table.extend(pool.allocate(needs[g]))
        seq.block_tables = tables
        return True

    def free(self, seq: Sequence) -> None:
        for pool, table in zip(self.pools, seq.block_tables):
            pool.release(table[::-1])  # tail first, so it is evicted first
        seq.block_tables = []
        seq.registered_blocks = 0

    def release_tail(self, seq: Sequence) -> None:
        """Give back the blocks past those the sequence's tokens need: after a speculative step
        they held only rejected drafts (never registered: they were never fully computed)."""
        keep = self.max_blocks_needed(seq.num_tokens)
        for pool, table in zip(self.pools, seq.block_tables):
            if len(table) > keep:
                pool.release(table[keep:][::-1])  # tail first, as `free` does
                del table[keep:]

    def cache_computed_blocks(self, seq: Sequence) -> list[tuple[bytes, list[int]]]:
        """Name the full blocks `seq` has computed so later prompts can find them. Returns the
        blocks named for the first time and held in every group, (hash, block per group): what
        the KV connector keeps (engine/kv_tiers/connector.py)."""
        if not self.enable_prefix_caching:
            return []
        full = min(seq.num_computed // self.block_size, len(seq.block_hashes))
        named = []
        for i in range(seq.registered_blocks, full):
            new, blocks = False, []
            for pool, table in zip(self.pools, seq.block_tables):
                block = table[i] if i < len(table) else NULL_BLOCK
                blocks.append(block)
                if block != NULL_BLOCK:
                    new = pool.register(block, seq.block_hashes[i]) or new
            if new and NULL_BLOCK not in blocks:
                named.append((seq.block_hashes[i], blocks))
        seq.registered_blocks = max(seq.registered_blocks, full)
        return named

    def add_loaded_blocks(
        self, prefix: tuple[int, list[list[int]]], hashes: list[bytes], count: int
    ) -> tuple[tuple[int, list[list[int]]], list[list[int]]] | None:
        """Extend a cached `prefix` (from `find_cached_prefix`) by `count` blocks read from a KV
        tier: fresh blocks, named at once (their contents arrive before the step runs:
        StepRecord.kv_loads). A sliding group takes only the blocks inside its window. Returns
        (the longer prefix, per group the loaded blocks' ids, NULL_BLOCK where not needed), or
        None when a pool is short. Until `settle_loaded` or `drop_loaded` the fresh blocks
        hold one reference of their own."""
        first, tables = prefix[0] // self.block_size, prefix[1]
        end = first + count
        wanted = [range(max(first, self._first_needed_block(g, end * self.block_size)), end)
                  for g in range(len(self.pools))]  # fmt: skip
        if any(len(w) > pool.num_free for w, pool in zip(wanted, self.pools)):
            return None
        loaded, longer = [], []
        for g, pool in enumerate(self.pools):
            fresh = iter(pool.allocate(len(wanted[g])))
            blocks = [next(fresh) if i in wanted[g] else NULL_BLOCK for i in range(first, end)]
            for i, block in zip(range(first, end), blocks):
                if block != NULL_BLOCK:
                    pool.register(block, hashes[i])
            loaded.append(blocks)
            longer.append(list(tables[g]) + blocks)
        return (end * self.block_size, longer), loaded

    def settle_loaded(self, loaded: list[list[int]]) -> None:
        """The sequence took the loaded blocks (`allocate` shared them): drop their own
        reference."""
        for pool, blocks in zip(self.pools, loaded):
            for block in blocks:
                if block != NULL_BLOCK:
                    pool.ref[block] -= 1

    def drop_loaded(self, loaded: list[list[int]]) -> None:
        """Undo `add_loaded_blocks` (the sequence could not be admitted): the blocks are
        unnamed (their contents never arrived) and go back to the pool."""
        for pool, blocks in zip(self.pools, loaded):
            live = [b for b in blocks if b != NULL_BLOCK]
            for block in live:
                pool.unregister(block)
            pool.release(live)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]] | None:
        """Give `child` the blocks of the parent's `num_computed` tokens: full blocks shared,
        the partial last block copied. Returns the (group, src, dst) copies to make on the
        device, or None if no room."""
        partial = parent.num_computed % self.block_size != 0
        if partial and any(pool.num_free < 1 for pool in self.pools):
            return None
        copies, tables = [], []
        for g, (pool, table) in enumerate(zip(self.pools, parent.block_tables)):
            shared = table[:-1] if partial else table
            for b in shared:
                if b != NULL_BLOCK:
                    pool.share(b)
            new_table = list(shared)
            if partial:
                (dst,) = pool.allocate(1)
                copies.append((g, table[-1], dst))
                new_table.append(dst)
            tables.append(new_table)
        child.block_tables = tables
        child.registered_blocks = parent.registered_blocks
        return copies

    def take_fresh_blocks(self) -> list[list[int]]:
        """Per group, blocks handed out for the first time since the last call."""
        fresh = [pool.fresh for pool in self.pools]
        for pool in self.pools:
            pool.fresh = []
        return fresh

    def reset_prefix_cache(self) -> None:
        for pool in self.pools:
            pool.reset_cache()

    def forget_contents(self) -> None:
        """Every pool's memory is gone (BlockPool.forget_contents)."""
        for pool in self.pools:
            pool.forget_contents()
