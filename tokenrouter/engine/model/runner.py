"""Turns a scheduled batch into one packed forward pass of a transformers model over the paged cache."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..attention import AttentionBackend, AttentionMetadata, step_context, to_device
from ..sched import ScheduledBatch
from .cuda_graph import DecodeGraphs
from .fused_decoder import FusedDecoder
from .loader import LoadedModel
from .torch_threads import use_threads

log = logging.getLogger(__name__)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [len(sample_rows), vocab]
    sample_rows: list[int]  # batch rows whose last new token is the sequence's last token
    model_time: float  # seconds inside the model's forward (the rest of a step is engine overhead)
    threads: int  # torch intra-op threads the forward ran on
    hidden: torch.Tensor | None = None  # [len(sample_rows), H] last hidden states, when captured
    # per batch row with a verifier's check: [span, vocab] logits from the position before its
    # first tentative token to the last position (the last row equals the row's `logits`)
    verify: dict[int, torch.Tensor] = field(default_factory=dict)
    # per batch row whose chunk holds prompt positions still to be scored (prompt_logprobs):
    # (first such position p, [count, vocab] logits at p .. p + count - 1, each predicting the next)
    prompt: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


@dataclass
class PackedRows:
    """A step's rows as they are packed: token ids, and per row its positions and cache slots."""

    ids: list[int] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    last_index: list[int] = field(default_factory=list)


@dataclass
class PreparedStep:
    """A scheduled batch as the model takes it: one packed row of tokens."""

    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    meta: AttentionMetadata
    sample_rows: list[int]  # batch rows whose last new token is the sequence's last token
    last_index: list[int]  # for each of those, its last token's index in the packed row
    keep: torch.Tensor  # [rows] the packed rows whose logits are computed: last_index, then the extra ones


class HiddenCapture:
    """Keeps the input of the model's output head: the last hidden states of the rows whose
    logits are computed. A forward pre-hook, so any architecture transformers implements works
    the same (its own final norm included) and nothing else is materialised."""

    def __init__(self, model: torch.nn.Module):
        self.hidden: torch.Tensor | None = None
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output head to read hidden states from")
        self._handle = head.register_forward_pre_hook(self._keep)

    def remove(self) -> None:
        self._handle.remove()

    def _keep(self, module, args) -> None:
        self.hidden = args[0]

    def take(self) -> torch.Tensor:
        hidden, self.hidden = self.hidden, None
        assert hidden is not None, "the output head did not run"
        return hidden


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        backend: AttentionBackend,
        block_size: int,
        capture_hidden: bool = False,
        compute: Callable[[Callable[[], ForwardOutput]], ForwardOutput] | None = None,
        threads: int | None = None,
    ):
        self.compute = compute  # runs the forward elsewhere (the shared CPU compute thread), if given
        self.threads = threads  # torch threads every forward runs on (None: the thread's own count)
        self.loaded = loaded
        self.model = loaded.model
        self.backend = backend
        self.block_size = block_size
        self.device = loaded.device
        self.capture = HiddenCapture(loaded.model) if capture_hidden else None
        self.graphs: DecodeGraphs | None = None  # CUDA graphs of decode steps (engine/model/cuda_graph.py)
        self.graph_error: str | None = None  # why capturing them failed ("RuntimeError: ..."), if it did
        # the forward as a few C calls a layer (engine/model/fused_decoder.py), where it serves
        self.fused, self.fused_off = FusedDecoder.of(loaded.model, loaded.dtype, loaded.device)

    def capture_graphs(self, max_batch: int, scratch_block: int) -> None:
        """CUDA graphs of pure-decode steps up to `max_batch` rows, padded onto `scratch_block`
        (a KV block no request owns). A model whose forward cannot be captured (a host sync in
        it, as in dynamic RoPE scaling) runs every step eagerly instead, with a warning."""
        pages = -(-self.loaded.max_model_len // self.block_size)
        graphs = DecodeGraphs(
            self.run_model, self.backend, self.device, self.block_size, max_batch, scratch_block, pages
        )
        try:
            graphs.capture()
        except Exception as e:
            self.graph_error = f"{type(e).__name__}: {e}"
            log.warning(
                "model %r: CUDA graph capture failed, decode steps run eagerly: %s",
                self.loaded.name,
                self.graph_error,
                exc_info=True,
            )
            return
        self.graphs = graphs

    @property
    def forward_kind(self) -> str:
        """ "fused" where the fused decoder serves, else "transformers: " and why not."""
        return "fused" if self.fused is not None else f"transformers: {self.fused_off}"

    @property
    def graph_sizes(self) -> list[int]:
        """Decode batch sizes replayed from CUDA graphs (none on CPU, or if capture failed)."""
        return list(self.graphs.sizes) if self.graphs is not None else []

    def _slots(self, block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = self.block_size
        return block_table[positions // bs] * bs + positions % bs

    def prepare(self, batch: ScheduledBatch, extra_rows: list[int] | None = None) -> PreparedStep:
        """The batch packed into one row of tokens (no padding): the decode rows first, then the
        prefill and catch-up rows, with positions, cache slots and the attention metadata; `keep`
        the rows whose logits are computed (each sampled row's last, then `extra_rows`).
        Everything is built on the host and reaches the device in one copy (attention/device_copy.py)."""
        rows = PackedRows()
        tables = self.pack_decodes(batch, rows)
        prefill_rows, prefill_slots = self.pack_prefills(batch, rows)
        keep = torch.tensor(rows.last_index + (extra_rows or []), dtype=torch.long)
        host = [torch.tensor(rows.ids, dtype=torch.long), torch.cat(rows.positions), torch.cat(rows.slots), keep]
        ids, positions, slots, keep, tables, *prefill_slots = to_device([*host, tables, *prefill_slots], self.device)
        nd = batch.num_decode
        mask = decode_positions = None
        if nd:  # a decode row's context is its positions up to the new token's
            decode_positions = positions[:nd]
            width = tables.shape[1] * self.block_size
            mask = torch.arange(width, device=positions.device)[None, :] <= decode_positions[:, None]
        meta = AttentionMetadata(
            slot_mapping=slots,
            num_decode=nd,
            decode_block_tables=tables,
            decode_mask=mask,
            decode_positions=decode_positions,
            prefill_rows=prefill_rows,
            prefill_slots=prefill_slots,
            query_lens=batch.num_new,
            context_lens=[s.num_computed + n for s, n in zip(batch.seqs, batch.num_new)],
            block_tables=[s.block_table for s in batch.seqs],
            block_size=self.block_size,
        )
        return PreparedStep(ids, positions, meta, rows.sample_rows, rows.last_index, keep)

    def pack_decodes(self, batch: ScheduledBatch, rows: PackedRows) -> torch.Tensor | None:
        """The decode rows, one token each: their positions and slots into `rows`; returns their
        block tables padded to the widest (host tensors)."""
        nd = batch.num_decode
        if not nd:
            return None
        bs = self.block_size
        dseqs = batch.seqs[:nd]
        width = max(len(s.block_table) for s in dseqs)
        tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in dseqs])
        positions = torch.tensor([s.num_computed for s in dseqs])
        rows.ids.extend(s.token_ids[s.num_computed] for s in dseqs)
        rows.positions.append(positions)
        last_block = tables.gather(1, (positions // bs)[:, None]).squeeze(1)
        rows.slots.append(last_block * bs + positions % bs)
        rows.sample_rows.extend(range(nd))
        rows.last_index.extend(range(nd))
        return tables

    def pack_prefills(self, batch: ScheduledBatch, rows: PackedRows) -> tuple[list, list]:
        """The prefill and catch-up rows: per row (start in the packed tokens, new tokens, context
        length), and the cache slots of its whole context when part of it was cached before
        (host tensors)."""
        prefill_rows: list[tuple[int, int, int]] = []
        prefill_slots: list[torch.Tensor | None] = []
        start = batch.num_decode
        for row in range(batch.num_decode, len(batch)):
            seq, n = batch.seqs[row], batch.num_new[row]
            first = seq.num_computed
            ctx_len = first + n
            table = torch.tensor(seq.block_table)
            rows.ids.extend(seq.token_ids[first:ctx_len])
            pos = torch.arange(first, ctx_len)
            rows.positions.append(pos)
            rows.slots.append(self._slots(table, pos))
            prefill_rows.append((start, n, ctx_len))
            prefill_slots.append(self._slots(table, torch.arange(ctx_len)) if first else None)
            if ctx_len == len(seq.token_ids):
                rows.sample_rows.append(row)
                rows.last_index.append(start + n - 1)
            start += n
        return prefill_rows, prefill_slots

    def forward(self, batch: ScheduledBatch) -> ForwardOutput:
        if self.compute is not None:
            return self.compute(lambda: self.execute(batch))
        return self.execute(batch)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> ForwardOutput:
        """The forward, in the calling thread (`forward` runs it in the compute thread, if any)."""
        if self.threads is not None:
            use_threads(self.threads)
        extra, spans = self.verify_positions(batch)
        scored, prompt_spans = self.prompt_positions(batch)
        step = self.prepare(batch, extra + scored)
        input_ids, positions, meta = step.input_ids, step.positions, step.meta
        sample_rows, last_index = step.sample_rows, step.last_index
        t0 = time.perf_counter()
        if self.graphs is not None and self.graphs.fits(len(batch), batch.num_decode):  # graph or eager: ours to choose
            logits, hidden = self.graphs.replay(input_ids, positions, meta)
        else:
            self.backend.plan(meta)
            logits, hidden = self.run_model(input_ids, positions, meta, step.keep)
        verify, prompt = {}, {}
        n = len(last_index)
        if spans:  # a check's rows: every position but the last after the sampled rows, then the last
            last = {row: i for i, row in enumerate(sample_rows)}
            for row, (offset, count) in spans.items():
                verify[row] = torch.cat([logits[n + offset : n + offset + count], logits[last[row] : last[row] + 1]])
        for row, (offset, count, first) in prompt_spans.items():  # after the checks' rows
            prompt[row] = (first, logits[n + len(extra) + offset : n + len(extra) + offset + count])
        if spans or prompt_spans:
            logits, hidden = logits[:n], (hidden[:n] if hidden is not None else None)
        return ForwardOutput(
            logits, sample_rows, time.perf_counter() - t0, torch.get_num_threads(), hidden, verify, prompt
        )

    @staticmethod
    def prompt_positions(batch: ScheduledBatch) -> tuple[list[int], dict[int, tuple[int, int, int]]]:
        """For prefill rows of requests scoring their prompt (prompt_logprobs): the batch indices
        of the chunk's prompt positions not yet scored, before the prompt's last (whose logits are
        the first token's), and per such row where they start among them, how many, and the first
        position. Other requests add nothing: their steps keep only the logits they sample from."""
        extra: list[int] = []
        spans: dict[int, tuple[int, int, int]] = {}
        start = batch.num_decode
        for row in range(batch.num_decode, len(batch)):
            seq, n = batch.seqs[row], batch.num_new[row]
            if seq.needs_prompt_logits:
                first = max(seq.num_computed, len(seq.prompt_logprobs))
                end = min(seq.num_computed + n, seq.req.num_prompt_tokens - 1)
                if end > first:
                    spans[row] = (len(extra), end - first, first)
                    extra.extend(start + (p - seq.num_computed) for p in range(first, end))
            start += n
        return extra, spans

    @staticmethod
    def verify_positions(batch: ScheduledBatch) -> tuple[list[int], dict[int, tuple[int, int]]]:
        """For rows that reach the end of a sequence with a verifier's check: the batch indices of
        the check's positions but the last (whose logits every final row gets anyway), and per
        such row where its span starts among them and how long it is."""
        extra: list[int] = []
        spans: dict[int, tuple[int, int]] = {}
        start = batch.num_decode
        for row in range(batch.num_decode, len(batch)):
            seq, n = batch.seqs[row], batch.num_new[row]
            end = seq.num_computed + n
            if seq.verify_start is not None and end == len(seq.token_ids):
                first = seq.first_logit_position
                assert first >= seq.num_computed, "the scheduler keeps a check's positions in the last chunk"
                spans[row] = (len(extra), end - 1 - first)
                extra.extend(start + (p - seq.num_computed) for p in range(first, end - 1))
            start += n
        return extra, spans

    def run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, keep: torch.Tensor | int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's forward over a planned step: logits of the `keep` rows (0: every row; float32
        or wider whatever the model computes in), and their last hidden states when captured.
        Nothing here syncs the device, so CUDA graphs capture it as it is."""
        with step_context(self.backend, meta):
            if self.fused is not None:
                logits = self.fused(input_ids, positions, self.backend, meta, keep)
            else:
                logits = self.model(
                    input_ids=input_ids[None], position_ids=positions[None], use_cache=False, logits_to_keep=keep
                ).logits[0]
        hidden = self.capture.take() if self.capture is not None else None
        hidden = hidden[0] if hidden is not None and hidden.dim() == 3 else hidden
        if logits.dtype in (torch.bfloat16, torch.float16):  # the sampler and every policy read float32
            logits = logits.float()
        return logits, hidden
