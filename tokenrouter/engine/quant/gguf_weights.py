"""A GGUF checkpoint's weights, read tensor by tensor: the quantized matrices as their own blocks
(`tensor`), and any tensor dense (`dense`: the norms, biases and whatever no kernel takes).

A Q4_K tensor can also be kept as its 4-bit codes with one scale and one offset per sub-block of
32 (`q4k_groups`, for torch's int4 kernel): the checkpoint's own arithmetic, w = scale * q - minus.
Other types are dequantized with gguf's reference code.

Names follow gguf's tensor-name map for the architecture. llama.cpp's converter permutes the
rows of a Llama model's q and k projections (its rotary layout), and transformers permutes them
back; the same row order is applied here. Dense tensors go through transformers' own per-arch
fix-ups (`TENSOR_PROCESSORS`: that permutation, Gemma's norms stored plus one), so they are what
transformers' GGUF loader would give. Architectures not listed in `ARCHS` are refused by name.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import ModelLoadError
from .gguf_index import tensor_places

# transformers' model_type -> gguf's architecture name: the decoder-only models whose GGUF tensors
# are the Hugging Face ones one to one, but for the fix-ups transformers' processors apply
ARCHS = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "mistral": "llama", "gemma3_text": "gemma3"}
_PERMUTED = {"llama", "mistral"}  # q/k rows in llama.cpp's rotary order


@dataclass
class GGUFTensor:
    name: str
    kind: str  # gguf's quantization type name: "Q4_K", "Q6_K", "Q8_0", "F32", ...
    rows: int  # out features (or vocabulary rows)
    cols: int  # in features
    data: np.ndarray  # the file's bytes, [rows, bytes per row]
    row_order: torch.Tensor | None = None  # rows to take, in order (the llama permutation)


class GGUFWeights:
    """The quantized tensors of one GGUF file, looked up by the Hugging Face parameter they fill."""

    def __init__(self, path: Path, config):
        from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        model_type = text.model_type
        if model_type not in ARCHS:
            raise ModelLoadError(
                f"{path}: computing {model_type!r} models from a GGUF is not supported "
                f"(supported: {', '.join(sorted(ARCHS))})"
            )
        arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == ARCHS[model_type])
        self.path = path
        self.tensors = tensor_places(path)
        self.names = get_tensor_name_map(arch, text.num_hidden_layers)
        self.heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.permuted = model_type in _PERMUTED
        self.processor = TENSOR_PROCESSORS.get(ARCHS[model_type], TensorProcessor)(config=text.to_dict())

    def close(self) -> None:
        """Forget the tensors' places (what was read is copied out by then)."""
        self.tensors.clear()

    def gguf_name(self, param_name: str) -> str | None:
        """The GGUF tensor holding a Hugging Face parameter ("model.norm.weight" -> "output_norm.weight")."""
        module, _, leaf = param_name.rpartition(".")
        mapped = self.names.get_name(module)
        name = f"{mapped}.{leaf}" if mapped is not None else None
        return name if name in self.tensors else None

    def dense(self, param_name: str) -> torch.Tensor | None:
        """A parameter's values from the file, float32 in the shape torch holds them (dequantized
        where the file keeps blocks), or None where the file has no tensor for it."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        name = self.gguf_name(param_name)
        if name is None:
            return None
        t = self.tensors[name]
        raw = np.fromfile(self.path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        values = dequantize(raw.reshape(-1, t.n_bytes // max(1, _rows(t.shape))), GGMLQuantizationType[t.kind])
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(t.shape)))
        values = self.processor.process(values, name).weights
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    def tensor(self, module_name: str, mapped: bool = False) -> GGUFTensor | None:
        """The GGUF matrix holding `<module_name>.weight`, or None if the file has none. Read into
        memory, or with `mapped` a read-only mapping of the file's bytes (for a table read a few
        rows at a time: only the pages read become resident)."""
        gguf_name = self.names.get_name(module_name)
        t = self.tensors.get(f"{gguf_name}.weight") if gguf_name is not None else None
        if t is None or len(t.shape) != 2:
            return None  # no such tensor, or a vector (a norm's weight): nothing to keep quantized
        rows, cols = t.shape[1], t.shape[0]  # gguf lists dims innermost first
        # otherwise read, not a view of a mapped file: pages of a mapping count as the process's
        # memory until it is unmapped, so the whole file would sit on top of the weights made from it
        data = mapped_bytes(self.path, t.offset, t.n_bytes) if mapped else None
        if data is None:
            data = np.fromfile(self.path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        data = data.reshape(rows, -1)
        order = None
        if self.permuted and gguf_name.endswith(("attn_q", "attn_k")):
            heads = self.heads if gguf_name.endswith("attn_q") else self.kv_heads
            order = unpermute_rows(rows, heads)
        return GGUFTensor(gguf_name, t.kind, rows, cols, data, order)


def main_kind(path: Path) -> str:
    """The type most of a GGUF's matrix bytes are in (the embedding table aside): Q4_K for the
    demo pair's Q4_K_M files, Q4_1 for SmolLM2's."""
    weight: dict[str, int] = {}
    for name, t in tensor_places(path).items():
        if len(t.shape) == 2 and not name.startswith("token_embd"):
            weight[t.kind] = weight.get(t.kind, 0) + t.n_bytes
    return max(weight, key=weight.get) if weight else "F32"


def _rows(shape: tuple[int, ...]) -> int:
    """How many rows of the innermost dimension a tensor has (gguf lists dims innermost first)."""
    rows = 1
    for d in shape[1:]:
        rows *= d
    return rows


def mapped_bytes(path: Path, offset: int, size: int) -> np.ndarray:
    """`size` bytes of the file at `offset`, as a read-only mapping that reads on demand (no
    readahead: a lookup reads the pages of its rows only). It stays open while the array lives."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), offset + size - start, access=mmap.ACCESS_READ, offset=start)
    if hasattr(mmap, "MADV_RANDOM"):
        buf.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(buf, dtype=np.uint8, count=size, offset=offset - start)


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary permutation of a q or k projection."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def q4k_groups(t: GGUFTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K tensor as (codes [rows, cols] uint8 in 0..15, scale and minus [rows, cols / 32]
    float32) with w = scale * code - minus per group of 32, exactly as llama.cpp dequantizes it.

    A super-block of 256 weights is: d and dmin (float16), twelve bytes packing eight 6-bit
    scales and eight 6-bit mins, then 128 bytes of 4-bit codes (each 32-byte run holds two
    sub-blocks: the low nibbles, then the high ones)."""
    if t.kind != "Q4_K":
        raise ValueError(f"{t.name} is {t.kind}, not Q4_K")
    n, k = t.rows, t.cols
    b = torch.from_numpy(np.array(t.data, copy=True)).view(n, k // 256, 144)
    d = b[..., 0:2].contiguous().view(torch.float16).float()
    dmin = b[..., 2:4].contiguous().view(torch.float16).float()
    s = b[..., 4:16].to(torch.int32)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], -1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], -1)
    qs = b[..., 16:].view(n, k // 256, 4, 32)
    codes = torch.stack([qs & 15, qs >> 4], 3).reshape(n, k)
    scale = (d * sc.float()).reshape(n, k // 32)
    minus = (dmin * mn.float()).reshape(n, k // 32)
    if t.row_order is not None:
        codes, scale, minus = codes[t.row_order], scale[t.row_order], minus[t.row_order]
    return codes.contiguous(), scale.contiguous(), minus.contiguous()


def dequantized(t: GGUFTensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor in float32 [rows, cols] by gguf's reference dequantization (only `rows`, in
    that order, if given)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    index = t.row_order
    if rows is not None:
        index = rows.cpu() if index is None else index[rows.cpu()]
    data = t.data if index is None else t.data[index.numpy()]
    out = dequantize(np.ascontiguousarray(data), GGMLQuantizationType[t.kind])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(-1, t.cols)
