"""Paged attention steps made by hand: the metadata the runner would pack for rows of (tokens
cached, new tokens) over given block tables, to check or time an attention backend without a
model, a scheduler or sequences."""

from __future__ import annotations

import torch

from ..engine import AttentionMetadata


def step_metadata(rows: list[tuple[int, int]], tables: list[list[int]], block_size: int) -> AttentionMetadata:
    """One step whose rows are (tokens already cached, new tokens), row i's blocks `tables[i]`;
    decode rows (one new token after a cached prefix) must come first, as the runner packs them."""
    nd = 0
    while nd < len(rows) and rows[nd][1] == 1 and rows[nd][0] > 0:
        nd += 1
    slots, prefill_rows, prefill_slots, start = [], [], [], 0
    for i, (cached, new) in enumerate(rows):
        table = torch.tensor(tables[i])
        pos = torch.arange(cached, cached + new)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        if i >= nd:
            ctx = torch.arange(cached + new)
            prefill_rows.append((start, new, cached + new))
            prefill_slots.append(table[ctx // block_size] * block_size + ctx % block_size if cached else None)
        start += new
    dtables = dmask = dpos = None
    if nd:
        width = max(len(t) for t in tables[:nd])
        dtables = torch.tensor([t + [0] * (width - len(t)) for t in tables[:nd]])
        dpos = torch.tensor([c for c, _ in rows[:nd]])
        dmask = torch.arange(width * block_size)[None, :] <= dpos[:, None]
    return AttentionMetadata(
        slot_mapping=torch.cat(slots),
        num_decode=nd,
        decode_block_tables=dtables,
        decode_mask=dmask,
        decode_positions=dpos,
        prefill_rows=prefill_rows,
        prefill_slots=prefill_slots,
        query_lens=[n for _, n in rows],
        context_lens=[c + n for c, n in rows],
        block_tables=tables,
        block_size=block_size,
    )


def consecutive_tables(rows: list[tuple[int, int]], block_size: int, first: int = 0) -> list[list[int]]:
    """Each row's blocks, one after another from block `first`."""
    tables = []
    for cached, new in rows:
        need = -(-(cached + new) // block_size)
        tables.append(list(range(first, first + need)))
        first += need
    return tables
