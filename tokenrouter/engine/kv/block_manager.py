"""Paged KV block accounting: allocation, freeing, and prefix sharing.

Blocks hold `block_size` tokens each. A full block is registered under a hash chained over
every token before and in it, so two requests with a common prompt prefix share the blocks of
that prefix (agent loops resend long histories). A block whose last user leaves goes back on
the free list but keeps its hash until it is reused, so a later request can still hit it.
Free blocks are reused least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..sequence import Sequence


@dataclass(frozen=True)
class BlockStats:
    """The pool's accounting, as a worker's statistics report it."""

    kv_blocks_total: int
    kv_blocks_free: int
    kv_block_size: int
    prefix_cache_hit_tokens: int  # tokens served from the prefix cache so far


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.prefix_caching = prefix_caching
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[tuple | None] = [None] * num_blocks  # (hash, tokens) of a full block
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.prefix_hits = 0  # tokens served from the prefix cache, for stats

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def stats(self) -> BlockStats:
        return BlockStats(self.num_blocks, self.num_free, self.block_size, self.prefix_hits)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        key = self.block_keys[block_id]
        if key is not None:  # reusing a block that still held a cached prefix: forget it
            if self.cached.get(key[0]) == block_id:
                del self.cached[key[0]]
            self.block_keys[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _ref(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            del self.free_ids[block_id]
        self.ref_counts[block_id] += 1

    @staticmethod
    def _chain(prev: int, tokens: tuple[int, ...]) -> int:
        return hash((prev, tokens))

    def prefix_hashes(self, seq: Sequence) -> tuple[list[int], int]:
        """The chained hashes of the sequence's full blocks before the first position whose
        logits it needs (its last token, a verifier's check, or a prompt still to be scored), and
        how many of them lead off cached (what `match_prefix` would attach)."""
        if not self.prefix_caching:
            return [], 0
        tokens, bs = seq.token_ids, self.block_size
        hashes, cached, h = [], 0, 0
        for i in range(seq.cacheable_length // bs):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = self._chain(h, chunk)
            hashes.append(h)
            block_id = self.cached.get(h)
            if cached == i and block_id is not None and self.block_keys[block_id] == (h, chunk):
                cached += 1
        return hashes, cached

    def match_prefix(self, seq: Sequence, prefix: tuple[list[int], int] | None = None) -> None:
        """Attach cached blocks for the longest cached prefix of a sequence that holds no blocks
        (`prefix`: what `prefix_hashes` returned for it, if the caller has it already).

        Only blocks entirely before the first position whose logits the sequence needs are
        matched: that position is always computed, so its logits exist and no shared block is
        ever written.
        """
        assert not seq.block_table and seq.num_computed == 0
        if not self.prefix_caching:
            return
        hashes, cached = prefix if prefix is not None else self.prefix_hashes(seq)
        for h in hashes[:cached]:
            block_id = self.cached[h]
            self._ref(block_id)
            seq.block_table.append(block_id)
        seq.num_computed = seq.num_hashed_blocks = len(seq.block_table)
        seq.num_computed *= self.block_size
        seq.num_cached_prompt = min(seq.num_computed, seq.req.num_prompt_tokens)
        self.prefix_hits += seq.num_computed

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Make the block table cover `num_tokens` tokens; False (and no change) if the pool is short."""
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > self.num_free:
            return False
        for _ in range(need):
            seq.block_table.append(self._take_free())
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish the sequence's newly completed full blocks to the prefix cache."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        tokens = seq.token_ids
        n_full = seq.num_computed // bs
        if n_full <= seq.num_hashed_blocks:
            return
        i = seq.num_hashed_blocks
        h = self.block_keys[seq.block_table[i - 1]][0] if i > 0 else 0
        for i in range(seq.num_hashed_blocks, n_full):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = self._chain(h, chunk)
            block_id = seq.block_table[i]
            if self.block_keys[block_id] is None:
                self.block_keys[block_id] = (h, chunk)
                self.cached.setdefault(h, block_id)
        seq.num_hashed_blocks = n_full

    def forget_free_prefixes(self) -> int:
        """Forget the cached prefixes of free blocks (blocks in use keep theirs): later requests
        start cold, as on a fresh pool. Returns the number of blocks forgotten."""
        n = 0
        for block_id in self.free_ids:
            key = self.block_keys[block_id]
            if key is not None:
                if self.cached.get(key[0]) == block_id:
                    del self.cached[key[0]]
                self.block_keys[block_id] = None
                n += 1
        return n

    def truncate(self, seq: Sequence, num_tokens: int) -> list[tuple[int, int]]:
        """Keep the sequence's KV for its first `num_tokens` positions only (a rollback): the
        positions after are computed again, into blocks nobody else reads.

        Blocks wholly past the kept positions are dropped (a cached one stays in the prefix cache:
        its content is still right for its tokens). The block holding the cut, if the cut is
        inside it and the block is in the prefix cache or shared, is copied on write: a new block
        takes its place, so a cached block never changes content. Returns the (source,
        destination) blocks the caller copies in the KV pool before the next forward."""
        bs = self.block_size
        keep = self.blocks_for(num_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_ids[block_id] = None
        del seq.block_table[keep:]
        copies = []
        if num_tokens % bs and keep:
            last = seq.block_table[-1]
            if self.ref_counts[last] > 1 or self.block_keys[last] is not None:
                new = self._take_free() if self.free_ids else None
                if new is None:  # no block to copy into: recompute the whole block instead
                    self.ref_counts[last] -= 1
                    if self.ref_counts[last] == 0:
                        self.free_ids[last] = None
                    seq.block_table.pop()
                    num_tokens = len(seq.block_table) * bs
                else:
                    copies.append((last, new))
                    self.ref_counts[last] -= 1
                    if self.ref_counts[last] == 0:
                        self.free_ids[last] = None
                    seq.block_table[-1] = new
        seq.num_computed = min(seq.num_computed, num_tokens)
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, num_tokens // bs)
        return copies

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's blocks; blocks no one else uses return to the free list."""
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_ids[block_id] = None
        seq.block_table = []
        seq.num_computed = 0
        seq.num_hashed_blocks = 0
