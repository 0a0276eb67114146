"""A step's rows described the way paged-attention kernels (flashinfer, FlashAttention's paged
mode) want them: CSR offsets over the new tokens and over each row's pages, plus where each new
token lands. Pure torch, so it is built and checked the same way on CPU and GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backend import AttentionMetadata
from .device_copy import to_device


@dataclass
class PagedLayout:
    """Rows r = 0..B-1; row r's new tokens are qo_indptr[r]:qo_indptr[r+1] of the packed batch and
    its context is the pages kv_indices[kv_indptr[r]:kv_indptr[r+1]], the last of them holding
    kv_last_page_len[r] tokens. A row's queries are the last tokens of its context (causal
    masks align bottom-right). All tensors int32, on one device."""

    qo_indptr: torch.Tensor  # [B + 1]
    kv_indptr: torch.Tensor  # [B + 1]
    kv_indices: torch.Tensor  # [kv_indptr[B]] block ids
    kv_last_page_len: torch.Tensor  # [B], in 1..page_size
    batch_indices: torch.Tensor  # [num_tokens] row of each new token
    positions: torch.Tensor  # [num_tokens] position of each new token in its row's context
    page_size: int

    @classmethod
    def from_metadata(cls, meta: AttentionMetadata, device: torch.device | str = "cpu") -> PagedLayout:
        return cls.build(meta.query_lens, meta.context_lens, meta.block_tables, meta.block_size, device)

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        page_size: int,
        device: torch.device | str = "cpu",
    ) -> PagedLayout:
        pages = [(c + page_size - 1) // page_size for c in context_lens]
        indices: list[int] = []
        for table, n in zip(block_tables, pages):
            if len(table) < n:
                raise ValueError(f"a row of {n} pages has a block table of {len(table)} blocks")
            indices.extend(table[:n])
        q = torch.tensor(query_lens, dtype=torch.int32)
        ctx = torch.tensor(context_lens, dtype=torch.int32)
        qo_indptr = torch.zeros(len(q) + 1, dtype=torch.int32)
        torch.cumsum(q, 0, out=qo_indptr[1:])
        kv_indptr = torch.zeros(len(q) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0, out=kv_indptr[1:])
        rows = torch.arange(len(q), dtype=torch.int32)
        batch_indices = rows.repeat_interleave(q)
        # token t of row r sits at (context_len - query_len) + (t - qo_indptr[r])
        offset = (ctx - q - qo_indptr[:-1]).repeat_interleave(q)
        positions = torch.arange(int(qo_indptr[-1]), dtype=torch.int32) + offset
        last = ctx - (torch.tensor(pages, dtype=torch.int32) - 1) * page_size
        layout = cls(
            qo_indptr, kv_indptr, torch.tensor(indices, dtype=torch.int32), last, batch_indices, positions, page_size
        )
        return layout.to(device)

    @property
    def num_rows(self) -> int:
        return self.kv_last_page_len.shape[0]

    def to(self, device: torch.device | str) -> PagedLayout:
        """On `device`: itself where it is, else from the host in one copy (attention/device_copy.py)."""
        if torch.device(device) == self.qo_indptr.device:
            return self
        tensors = (
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.kv_last_page_len,
            self.batch_indices,
            self.positions,
        )
        return PagedLayout(*to_device(tensors, device), self.page_size)

    def rows(self, start: int, stop: int) -> PagedLayout:
        """Rows start..stop-1, rebased to 0; host layouts only (int() reads offsets), as flashinfer_paged plans."""
        q0, q1 = int(self.qo_indptr[start]), int(self.qo_indptr[stop])
        k0, k1 = int(self.kv_indptr[start]), int(self.kv_indptr[stop])
        return PagedLayout(
            self.qo_indptr[start : stop + 1] - q0,
            self.kv_indptr[start : stop + 1] - k0,
            self.kv_indices[k0:k1],
            self.kv_last_page_len[start:stop],
            self.batch_indices[q0:q1] - start,
            self.positions[q0:q1],
            self.page_size,
        )

    def slots(self) -> torch.Tensor:
        """The cache slot (block * page_size + offset) each new token is written to."""
        page = self.kv_indices[
            self.kv_indptr[self.batch_indices.long()].long() + self.positions.long() // self.page_size
        ]
        return page.long() * self.page_size + self.positions.long() % self.page_size
