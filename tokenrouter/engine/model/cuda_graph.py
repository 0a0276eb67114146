"""CUDA graphs of decode steps: a small model's decode step is mostly kernel launches, so each
worker captures its model's pure-decode forward once per batch size at start and replays it.

A step of n decode rows replays the smallest captured size >= n. The extra rows decode one
token at position 0 of a scratch block, one block of the KV pool no request ever owns, so the
real rows' attention and cache are untouched; their logits are dropped. Sizes follow SGLang's
default: 1, 2, 4, 8, then every 8 up to the limit. Steps with prefill or extend rows, and
decode steps larger than the limit, run eagerly.

Capture is done as vLLM and SGLang do it: on the worker's own stream, the one its warm-up ran on
(a side stream if the caller is on the default stream, which cannot capture); in thread-local
capture mode, so a CUDA call in another thread (another worker's step) does not break it; and
under one lock per process, so two workers on one GPU never capture at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from ..attention import AttentionMetadata

if TYPE_CHECKING:
    from ..attention import FlashInferPagedAttention

CAPTURE_LOCK = threading.Lock()  # one capture at a time in this process

# (input ids, positions, planned metadata, rows to keep: 0 = all) -> (logits, hidden or None)
RunModel = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, int], tuple[torch.Tensor, torch.Tensor | None]]


def graph_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes to capture: 1, 2, 4, 8, 16, 24, ... up to and including max_batch."""
    if max_batch < 1:
        return []
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch] + list(range(16, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def pad_decode(
    input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, size: int, scratch_block: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A pure-decode step of meta.num_decode rows padded to `size` rows that write and read only
    the scratch block (token 0 at position 0: a context of one token)."""
    n = meta.num_decode
    assert n == len(meta.query_lens) and n <= size, "only pure-decode steps that fit are padded"
    pad = size - n
    bs = meta.block_size
    dev = input_ids.device
    long = {"dtype": torch.long, "device": dev}
    width = meta.decode_block_tables.shape[1] if n else 1
    tables = torch.full((pad, width), scratch_block, **long)
    mask = torch.zeros(pad, width * bs, dtype=torch.bool, device=dev)
    mask[:, 0] = True
    if n:
        tables = torch.cat([meta.decode_block_tables, tables])
        mask = torch.cat([meta.decode_mask, mask])
    zeros = torch.zeros(pad, **long)
    padded = AttentionMetadata(
        slot_mapping=torch.cat([meta.slot_mapping, torch.full((pad,), scratch_block * bs, **long)]),
        num_decode=size,
        decode_block_tables=tables,
        decode_mask=mask,
        decode_positions=torch.cat([meta.decode_positions, zeros]) if n else zeros,
        prefill_rows=[],
        prefill_slots=[],
        query_lens=list(meta.query_lens) + [1] * pad,
        context_lens=list(meta.context_lens) + [1] * pad,
        block_tables=list(meta.block_tables) + [[scratch_block]] * pad,
        block_size=bs,
    )
    return torch.cat([input_ids, zeros]), torch.cat([positions, zeros]), padded


def scratch_decode(size: int, scratch_block: int, block_size: int, device: torch.device):
    """The inputs of a decode step of `size` scratch rows only: what graphs are captured on."""
    empty = torch.zeros(0, dtype=torch.long, device=device)
    meta = AttentionMetadata(
        slot_mapping=empty,
        num_decode=0,
        decode_block_tables=None,
        decode_mask=None,
        decode_positions=None,
        prefill_rows=[],
        prefill_slots=[],
        query_lens=[],
        context_lens=[],
        block_tables=[],
        block_size=block_size,
    )
    return pad_decode(empty, empty, meta, size, scratch_block)


@contextmanager
def capture_stream(device: torch.device) -> Iterator[torch.cuda.Stream]:
    """The stream to warm up and capture on, made current: the caller's (a worker's own), or, if
    that is the default stream (which cannot capture), a side stream ordered after it both ways."""
    current = torch.cuda.current_stream(device)
    if current != torch.cuda.default_stream(device):
        yield current
        return
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield side
    current.wait_stream(side)


class DecodeGraphs:
    """One captured decode forward per batch size, sharing one memory pool (largest first).
    `run_model` is the runner's forward over a planned step; the runner owns these graphs and
    chooses, per step, to replay one or to run eagerly."""

    def __init__(
        self,
        run_model: RunModel,
        backend: FlashInferPagedAttention,
        device: torch.device,
        block_size: int,
        max_batch: int,
        scratch_block: int,
        max_pages_per_row: int,
    ):
        self.run_model = run_model
        self.backend = backend
        self.device = device
        self.block_size = block_size
        self.sizes = graph_batch_sizes(max_batch)
        self.scratch_block = scratch_block
        self.max_pages_per_row = max_pages_per_row
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]] = {}
        dev = device
        self.input_ids = torch.zeros(self.sizes[-1], dtype=torch.long, device=dev)
        self.positions = torch.zeros(self.sizes[-1], dtype=torch.long, device=dev)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def fits(self, num_rows: int, num_decode: int) -> bool:
        return num_rows == num_decode and 0 < num_rows <= self.max_batch

    @torch.inference_mode()  # else every captured forward would record autograd and keep its activations
    def capture(self) -> None:
        pool = None
        bs, dev = self.block_size, self.device
        with CAPTURE_LOCK, capture_stream(dev) as stream:
            try:
                for size in reversed(self.sizes):
                    ids, pos, meta = scratch_decode(size, self.scratch_block, bs, dev)
                    self.input_ids[:size].copy_(ids)
                    self.positions[:size].copy_(pos)
                    self.backend.use_graph(size, self.max_pages_per_row)
                    self.backend.plan(meta)
                    static_ids, static_pos = self.input_ids[:size], self.positions[:size]
                    self.run_model(static_ids, static_pos, meta, 0)  # warm-up; plans every layer kind
                    stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                        logits, hidden = self.run_model(static_ids, static_pos, meta, 0)
                    pool = graph.pool()
                    self.graphs[size] = (graph, logits, hidden)
            finally:
                self.backend.use_graph(None)

    def replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (and hidden states, if captured) of a pure-decode step's rows: copies, since the
        graphs' outputs share one memory pool that the next replay of any size overwrites."""
        n = meta.num_decode
        size = next(s for s in self.sizes if s >= n)
        ids, pos, padded = pad_decode(input_ids, positions, meta, size, self.scratch_block)
        self.input_ids[:size].copy_(ids)
        self.positions[:size].copy_(pos)
        graph, logits, hidden = self.graphs[size]
        self.backend.use_graph(size, self.max_pages_per_row)
        try:
            self.backend.plan(padded)
            graph.replay()
        finally:
            self.backend.use_graph(None)
        return logits[:n].clone(), (hidden[:n].clone() if hidden is not None else None)
