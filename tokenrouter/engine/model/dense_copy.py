"""A GGUF's weights written once as a dense bf16 safetensors file, for the modes that compute on
dense weights (float32 or bfloat16 asked for, a GPU).

The default on CPU computes from the GGUF's own blocks and never needs this. A dense mode would
otherwise dequantize every tensor at every load (tens of seconds for the demo 1.5B), so the first
such load writes `model.safetensors` into the GGUF's files directory (`store.files_for`), tensor
by tensor (the header first, from the shapes; each tensor dequantized, rounded to bf16 and
written before the next is read), with progress; later loads stream it (weights.py). bf16 holds
the dequantized values to 8 bits of mantissa: the same copy the store always kept, at half of
float32's size.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import torch

from ...errors import ModelLoadError
from ...files import atomic_path
from ...store import log, progress
from ..quant import GGUFWeights
from .weights import empty_model

FILE = "model.safetensors"


def write(gguf_path: Path, config, directory: Path) -> Path:
    """Write `directory/model.safetensors` from the GGUF at `gguf_path` (bf16, every parameter
    the model holds once: a tied head is left to its embedding); return its path."""
    gguf = GGUFWeights(gguf_path, config)
    model = empty_model(config, torch.bfloat16, "eager")
    model.tie_weights()
    names = list(dict(model.named_parameters()))  # a tied head once, under its embedding's name
    missing = [n for n in names if gguf.gguf_name(n) is None]
    if missing:
        raise ModelLoadError(f"{gguf_path}: the GGUF holds no tensor for {', '.join(missing[:3])}")
    shapes = {n: list(reversed(gguf.tensors[gguf.gguf_name(n)].shape)) for n in names}
    header, offset = {}, 0
    for n in names:
        size = 2 * _numel(shapes[n])
        header[n] = {"dtype": "BF16", "shape": shapes[n], "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt", "source": gguf_path.name}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    out = directory / FILE
    t0 = time.monotonic()
    log(f"writing a dense bf16 copy of {gguf_path.name} to {out} (once: a dense mode needs it)")
    with (
        atomic_path(out) as tmp,
        open(tmp, "wb") as f,
        progress(total=offset, unit="B", unit_scale=True, desc="dense copy") as bar,
    ):
        f.write(struct.pack("<Q", len(blob)) + blob)
        for n in names:
            values = gguf.dense(n).to(torch.bfloat16).contiguous()
            f.write(values.reshape(-1).view(torch.uint8).numpy().data)
            bar.update(2 * values.numel())
    gguf.close()
    log(f"wrote {offset / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s")
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
