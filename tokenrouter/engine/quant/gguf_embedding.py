"""An embedding table kept in its GGUF blocks, the looked-up rows dequantized at each step.

A vocabulary of 151,936 rows is a large table (466 MB in bf16 for the 1.5B demo model) of which a
step reads a handful of rows. Keeping the checkpoint's own bytes (4.5 to 8.5 bits a weight) and
dequantizing just those rows with gguf's reference code costs microseconds a step and saves most
of the table. The blocks are a read-only mapping of the file where the loader maps them
(`GGUFWeights.tensor(..., mapped=True)`): only the pages of rows looked up become resident.
The block kernels' library dequantizes the rows where it has the type (`tr_gguf_rows`, the same
bits as gguf-py, 0.37 ms a decode step less on the demo 1.5B); gguf-py does the rest.
"""

from __future__ import annotations

import numpy as np
import torch

from . import gguf_native
from .gguf_weights import GGUFTensor, dequantized


class GGUFEmbedding(torch.nn.Module):
    def __init__(self, t: GGUFTensor, dtype: torch.dtype, padding_idx: int | None = None, scale=None):
        super().__init__()
        rows = t.data if t.row_order is None else np.ascontiguousarray(t.data[t.row_order.numpy()])
        self.table = GGUFTensor(t.name, t.kind, t.rows, t.cols, rows)
        self.num_embeddings, self.embedding_dim = t.rows, t.cols
        self.dtype = dtype
        self.padding_idx = padding_idx
        # what the replaced module multiplied its rows by (Gemma's sqrt(hidden)), as that module kept it
        self.embed_scale = scale
        self.weight = torch.empty(t.rows, t.cols, device="meta")  # its shape, for whoever reads it
        self.lib = gguf_native.load()[0] if t.kind in gguf_native.TYPES else None

    @property
    def nbytes(self) -> int:
        return self.table.data.nbytes

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if self.lib is not None:
            shape = (self.num_embeddings, self.embedding_dim)
            rows = gguf_native.rows(self.lib, self.table.kind, self.table.data, shape, flat.cpu()).to(self.dtype)
            out = rows.reshape(*ids.shape, self.embedding_dim)
        else:
            unique, inverse = torch.unique(flat, return_inverse=True)
            rows = dequantized(self.table, unique).to(self.dtype)
            out = rows[inverse].reshape(*ids.shape, self.embedding_dim)
        return out if self.embed_scale is None else out * self.embed_scale.to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.table.kind} blocks"
