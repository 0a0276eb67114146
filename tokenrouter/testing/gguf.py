"""GGUF files of tiny models, written the way llama.cpp writes them, so that everything the engine
does with a GGUF (its config, tokenizer and blocks; every block type) runs in tests on models that
load in milliseconds.

`write_gguf` writes a model directory's weights (norms and biases float32, matrices quantized),
its config as llama.cpp's metadata keys and its tokenizer as a "gpt2" (byte-level BPE)
vocabulary with merges: a file `Engine(models={"m": "model.gguf"})` loads on its own.
The K-quant writers (`quantize_q4k`, `quantize_q5k`, `quantize_q6k`) pick each sub-block's range
plainly (llama.cpp searches for a better one), which is all a test needs: the file is valid, and
what it holds is exactly what it holds. The other types come from gguf's own quantizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

# transformers' model_type -> llama.cpp's architecture name, where they differ
GGUF_ARCH = {"mistral": "llama", "gemma3_text": "gemma3"}


def _k_ranges(w: np.ndarray, levels: int):
    """Per sub-block of 32 of super-blocks of 256: 6-bit scales and mins under float16 d and dmin,
    and codes in 0..levels (w = d * sc * q - dmin * mn), as Q4_K and Q5_K hold them."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(rows, cols // 256, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    hi = np.maximum(x.max(-1), lo + 1e-8)
    scale_f, min_f = (hi - lo) / levels, -lo
    d = (scale_f.max(-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = (min_f.max(-1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale_f / np.maximum(d[..., None], 1e-30)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(min_f / np.maximum(dmin[..., None], 1e-30)), 0, 63).astype(np.uint8)
    step = np.maximum(d[..., None] * sc, 1e-30)[..., None]
    q = np.clip(np.round((x + (dmin[..., None] * mn)[..., None]) / step), 0, levels).astype(np.uint8)
    head = np.zeros((rows, cols // 256, 16), dtype=np.uint8)
    head[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    head[..., 2:4] = dmin.astype(np.float16)[..., None].view(np.uint8)
    scales = head[..., 4:16]  # eight 6-bit scales and mins, the top bits of 4..7 in bytes 0..7
    scales[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    scales[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:8] & 15) | ((mn[..., 4:8] & 15) << 4)
    return head, q.reshape(rows, cols // 256, 4, 2, 32)  # each pair: sub-blocks 2i and 2i+1


def quantize_q4k(w: np.ndarray) -> np.ndarray:
    """[rows, cols] float32 (cols a multiple of 256) to Q4_K blocks, [rows, cols / 256 * 144] uint8."""
    head, pairs = _k_ranges(w, 15)
    codes = pairs[..., 0, :] | (pairs[..., 1, :] << 4)  # each run of 32 bytes: sub-block 2i low, 2i+1 high
    return np.concatenate([head, codes.reshape(*head.shape[:2], 128)], -1).reshape(w.shape[0], -1)


def quantize_q5k(w: np.ndarray) -> np.ndarray:
    """[rows, cols] to Q5_K blocks (176 bytes a 256): Q4_K's head, 32 bytes of fifth bits (bit 2i
    of byte l: sub-block 2i's value l, bit 2i+1: sub-block 2i+1's), Q4_K's nibbles."""
    head, pairs = _k_ranges(w, 31)
    low = (pairs[..., 0, :] & 15) | ((pairs[..., 1, :] & 15) << 4)
    bits = np.zeros((*head.shape[:2], 32), dtype=np.uint8)
    for j in range(4):
        bits |= ((pairs[..., j, 0, :] >> 4) << (2 * j)) | ((pairs[..., j, 1, :] >> 4) << (2 * j + 1))
    return np.concatenate([head, bits, low.reshape(*head.shape[:2], 128)], -1).reshape(w.shape[0], -1)


def quantize_q6k(w: np.ndarray) -> np.ndarray:
    """[rows, cols] to Q6_K blocks (210 bytes a 256): 128 bytes of low nibbles, 64 of high bit
    pairs, 16 int8 scales (one per 16 values), float16 d; w = d * scale * (q - 32)."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(rows, cols // 256, 16, 16)
    scale_f = np.maximum(np.abs(x).max(-1), 1e-8) / 31.0
    d = (scale_f.max(-1) / 127.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale_f / np.maximum(d[..., None], 1e-30)), -128, 127).astype(np.int8)
    step = np.maximum(d[..., None] * sc, 1e-30)[..., None]
    q = np.clip(np.round(x / step) + 32, 0, 63).astype(np.uint8).reshape(rows, cols // 256, 2, 128)
    c = [q[..., i * 32 : (i + 1) * 32] for i in range(4)]  # per half: values l, l+32, l+64, l+96
    ql = np.concatenate([(c[0] & 15) | ((c[2] & 15) << 4), (c[1] & 15) | ((c[3] & 15) << 4)], -1)
    qh = (c[0] >> 4) | ((c[1] >> 4) << 2) | ((c[2] >> 4) << 4) | ((c[3] >> 4) << 6)
    out = np.concatenate(
        [
            ql.reshape(rows, cols // 256, 128),
            qh.reshape(rows, cols // 256, 64),
            sc.view(np.uint8).reshape(rows, cols // 256, 16),
            d.astype(np.float16)[..., None].view(np.uint8),
        ],
        -1,
    )
    return out.reshape(rows, -1)


K_QUANTS = {"Q4_K": quantize_q4k, "Q5_K": quantize_q5k, "Q6_K": quantize_q6k}


def quantize(w: np.ndarray, kind: str) -> np.ndarray:
    """`w` [rows, cols] float32 as GGUF blocks of `kind` ([rows, bytes a row] uint8)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    if kind in K_QUANTS:
        return K_QUANTS[kind](w)
    return gguf_quantize(w.astype(np.float32), GGMLQuantizationType[kind])


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for a Llama q or k projection (what the engine undoes)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def default_kind(cols: int) -> str:
    """As llama.cpp's Q4_K_M falls back: Q4_K where a row is whole 256-blocks, else Q8_0."""
    return "Q4_K" if cols % 256 == 0 else "Q8_0"


def write_gguf(model_dir: str | Path, path: str | Path | None = None, kind: str | None = None) -> Path:
    """Write `model_dir`'s model as a GGUF (`model.gguf` beside it, which a directory holding one
    GGUF names, or `path`); return the path. Every matrix is `kind` (default: `default_kind`),
    norms and biases float32; the config and tokenizer go into the metadata."""
    from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    path = Path(path) if path is not None else model_dir / "model.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    arch_name = GGUF_ARCH.get(config.model_type, config.model_type)
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name)
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    writer = GGUFWriter(path, arch_name)
    _write_config(writer, arch_name, config)
    _write_tokenizer(writer, AutoTokenizer.from_pretrained(model_dir))
    tied = config.tie_word_embeddings
    for name, param in model.named_parameters():  # a tied head is the embedding's: listed once
        module, _, leaf = name.rpartition(".")
        gguf_name = names.get_name(module)
        if gguf_name is None or (tied and module == "lm_head"):
            continue
        w = param.detach().float().numpy()
        if arch_name == "gemma3" and module.endswith("norm"):
            w = w + 1.0  # llama.cpp stores Gemma's norms plus one (transformers takes it back off)
        if arch_name == "llama" and gguf_name.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if gguf_name.endswith("attn_q") else config.num_key_value_heads
            w = llama_permute(w, heads)
        if w.ndim == 1:  # norms and biases, float32 as llama.cpp's converter keeps them
            writer.add_tensor(f"{gguf_name}.{leaf}", w)
            continue
        t = kind or default_kind(w.shape[1])
        writer.add_tensor(f"{gguf_name}.{leaf}", quantize(w, t), raw_dtype=GGMLQuantizationType[t])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_config(writer, arch_name: str, config) -> None:
    """The config as llama.cpp's keys: the inverse of transformers' own GGUF key map."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    writer.add_name(f"tiny {config.model_type}")
    for key, attr in GGUF_CONFIG_MAPPING[arch_name].items():
        value = getattr(config, attr, None) if attr else None
        if attr == "rope_theta" and value is None:
            value = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
        if value is None or key == "vocab_size":
            continue
        full = f"{arch_name}.{key}"
        if isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)


def _write_tokenizer(writer, tokenizer) -> None:
    """A byte-level BPE tokenizer as llama.cpp's "gpt2" vocabulary: tokens by id, merges, types
    (special tokens are control tokens), the special ids and the chat template."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    for attr, add in (("eos_token_id", writer.add_eos_token_id), ("pad_token_id", writer.add_pad_token_id)):
        if getattr(tokenizer, attr, None) is not None:
            add(getattr(tokenizer, attr))
    if tokenizer.bos_token_id is not None:
        writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


# llama.cpp's file types: what `requantize` writes (each a mix, as llama.cpp's own files are)
LLAMA_FTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL")


def requantize(gguf: str | Path, ftype: str, out: str | Path, threads: int = 2) -> Path:
    """`gguf` requantized by llama.cpp's own quantizer into its file type `ftype` (say "Q5_K_M"),
    written to `out` (kept: a file there is taken as made). Needs llama-cpp-python (the `anchor`
    extra). A requantized file holds the original's weights quantized twice: a test file, not a
    model to ship."""
    out = Path(out)
    if out.is_file():
        return out
    try:
        import llama_cpp
    except ImportError as e:
        raise RuntimeError("requantize needs llama-cpp-python: pip install 'tokenrouter[anchor]'") from e
    if ftype not in LLAMA_FTYPES:
        raise ValueError(f"ftype: one of {', '.join(LLAMA_FTYPES)}, not {ftype!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = threads
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    rc = llama_cpp.llama_model_quantize(str(gguf).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({gguf}, {ftype}) failed with {rc}")
    tmp.replace(out)
    return out
