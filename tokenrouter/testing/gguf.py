"""A GGUF file of a tiny model's weights, quantized the way llama.cpp's Q4_K_M files are, so the
engine's GGUF mode (`ModelSpec(quantization="gguf")`) runs in tests on models that load in
milliseconds.

`quantize_q4k` writes Q4_K super-blocks: 256 weights as eight sub-blocks of 32, each with a 6-bit
scale and a 6-bit min under a float16 d and dmin, and 4-bit codes. It picks each sub-block's range
plainly (llama.cpp searches for a better one), which is all a test needs: the file is valid, and
what it holds is exactly what it holds. Linear weights whose rows are a multiple of 256 long
become Q4_K, the others Q8_0 (gguf's own quantizer), as llama.cpp falls back for shapes Q4_K does
not fit. The file holds only the quantized tensors: the engine takes the rest from the directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def quantize_q4k(w: np.ndarray) -> np.ndarray:
    """[rows, cols] float32 (cols a multiple of 256) to Q4_K blocks, [rows, cols / 256 * 144] uint8."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(rows, cols // 256, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    hi = np.maximum(x.max(-1), lo + 1e-8)
    scale_f, min_f = (hi - lo) / 15.0, -lo
    d = (scale_f.max(-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = (min_f.max(-1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale_f / np.maximum(d[..., None], 1e-30)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(min_f / np.maximum(dmin[..., None], 1e-30)), 0, 63).astype(np.uint8)
    step = np.maximum(d[..., None] * sc, 1e-30)[..., None]
    q = np.clip(np.round((x + (dmin[..., None] * mn)[..., None]) / step), 0, 15).astype(np.uint8)
    out = np.zeros((rows, cols // 256, 144), dtype=np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = dmin.astype(np.float16)[..., None].view(np.uint8)
    scales = out[..., 4:16]  # eight 6-bit scales and mins, the top bits of 4..7 in bytes 0..7
    scales[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    scales[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:8] & 15) | ((mn[..., 4:8] & 15) << 4)
    pairs = q.reshape(rows, cols // 256, 4, 2, 32)  # each run of 32 bytes: sub-block 2i low, 2i+1 high
    out[..., 16:] = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(rows, cols // 256, 128)
    return out.reshape(rows, -1)


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for a Llama q or k projection (what the engine undoes)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write the GGUF of `model_dir`'s linear, embedding and norm weights beside it (`model.gguf`, which
    the engine's GGUF mode finds there) or at `path`; return the path."""
    from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
    from gguf.quants import quantize
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    path = Path(path) if path is not None else model_dir / "model.gguf"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    arch_name = {"mistral": "llama"}.get(config.model_type, config.model_type)
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name)
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    writer = GGUFWriter(path, arch_name)
    for name, module in model.named_modules():
        gguf_name = names.get_name(name)
        if gguf_name is None or getattr(module, "weight", None) is None:
            continue
        if module.weight.dim() == 1:  # norms, stored in float32 as llama.cpp's converter does
            writer.add_tensor(f"{gguf_name}.weight", module.weight.detach().float().numpy())
            continue
        w = module.weight.detach().float().numpy()
        if arch_name == "llama" and gguf_name.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if gguf_name.endswith("attn_q") else config.num_key_value_heads
            w = llama_permute(w, heads)
        if w.shape[1] % 256 == 0:
            data, kind = quantize_q4k(w), GGMLQuantizationType.Q4_K
        else:
            kind = GGMLQuantizationType.Q8_0
            data = quantize(w, kind)
        writer.add_tensor(f"{gguf_name}.weight", data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
