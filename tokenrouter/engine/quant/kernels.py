"""Which kernel computes each of a model's linear layers: the one module that decides.

- float32 or bfloat16 on CPU: oneDNN with the weight packed once at load (`onednn.py`);
- `quantization="int8"` (a drafter's): fbgemm's dynamic int8, the MLP outputs kept float32
  (`int8.py`), the rest packed;
- `quantization="gguf"`: each layer from its GGUF tensor: where the probe measured the GGUF
  block kernels faster, every tensor of a type they take (`gguf_blocks.KINDS`) as its own blocks
  (`gguf_blocks.py`), computed as llama.cpp does, and any other (IQ*, Q2_K, Q3_K, ...) dequantized
  and packed, the reason said in what `prepare_linears` returns; otherwise Q4_K as 4-bit groups
  (`int4.py`) and other quantized types as int8 weights (`int8_weights.py`); unquantized ones
  packed; the embedding table stays in its GGUF blocks (`gguf_embedding.py`), and an output head
  tied to it computes from the same blocks.
- `quantization="gguf+bf16"`: the same quantized kernels for calls of up to the rows a probe
  found them faster, and a dense bf16 copy of each weight, packed, for calls of more
  (`by_rows.py`): decode reads 4.5 bits a weight, big prefills compute in bf16;
- anything else (a GPU, float64): torch's own linear.

`gguf_sourced` names the parameters a GGUF's kernels supply, so that the loader never reads their
dense values at all: loading then peaks near what the model holds.
"""

from __future__ import annotations

import logging

import torch

from ...config import ModelSpec
from ...errors import ModelLoadError
from .. import native
from . import by_rows, gguf_blocks, gguf_native, int4, int8, int8_weights, kernel_cache, onednn
from .gguf_embedding import GGUFEmbedding
from .gguf_weights import GGUFWeights, dequantized, q4k_groups
from .precision import Precision

log = logging.getLogger(__name__)

QUANTIZED = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}  # torch's kernels take
FLOATS = {"F32", "F16", "BF16", "F64"}


def served(kind: str, cols: int, blocks: bool) -> bool:
    """Whether a linear layer's GGUF tensor is computed in its quantized form: by the block
    kernels (`blocks`) where they take its type, else by torch's int4/int8 kernels."""
    return gguf_blocks.fits(kind, cols) if blocks else kind in QUANTIZED


def gguf_sourced(model: torch.nn.Module, gguf: GGUFWeights, blocks: bool) -> set[str]:
    """Parameter names whose values the GGUF's kernels supply (the model may be on the meta
    device): the linear weights `served` says, and the embedding's unless its tensor is floats. A
    head tied to the embedding computes from the embedding's tensor; where no kernel takes that,
    both stay dense (and tied)."""
    out = set()
    head, shared, embed = model.get_output_embeddings(), tied_embedding(model), embed_name(model)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            t = gguf_tensor(gguf, name, shared if module is head else None, mapped=True)
            if t is not None and served(t.kind, t.cols, blocks):
                out.add(f"{name}.weight")
    t = gguf.tensor(embed, mapped=True)
    head_served = any(model.get_submodule(n.removesuffix(".weight")) is head for n in out)
    if t is not None and t.kind not in FLOATS and (shared is None or head_served):
        out.add(f"{embed}.weight")
    return out


def embed_name(model: torch.nn.Module) -> str:
    embed = model.get_input_embeddings()
    return next(n for n, m in model.named_modules() if m is embed)


def tied_embedding(model: torch.nn.Module) -> str | None:
    """The embedding's module name where the output head shares its weight, else None."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return None
    return next(n for n, m in model.named_modules() if m is embed)


def gguf_tensor(gguf: GGUFWeights, name: str, tied_to: str | None, mapped: bool):
    """The GGUF tensor a linear layer or the embedding computes from: its own, or for an output
    head tied to the embedding `tied_to` (llama.cpp then writes no `output` tensor) the embedding's."""
    t = gguf.tensor(name, mapped=mapped)
    if t is None and tied_to is not None:
        t = gguf.tensor(tied_to, mapped=mapped)
    return t


def prepare_linears(
    model: torch.nn.Module, spec: ModelSpec, precision: Precision, device: torch.device, gguf: GGUFWeights | None
) -> str:
    """Swap the model's linear layers (and, under gguf, its embedding) for their kernels; returns
    what they run on, e.g. "int4+int8+onednn" ("torch" where nothing was swapped)."""
    dtype = precision.dtype
    packing = spec.onednn_linear is not False and onednn.applies(device, dtype)
    if (spec.onednn_linear or spec.deterministic) and not packing:
        why = "this torch build has no oneDNN" if not onednn.available() else f"not {dtype} on {device}"
        why = why if onednn.not_refused(dtype) else native.cpu.current().torch_bf16
        asked = "onednn_linear=True" if spec.onednn_linear else "deterministic=True (oneDNN's packed linears)"
        raise ModelLoadError(f"{asked} for {spec.path}: it needs float32 or bfloat16 on CPU, {why}")
    if precision.quantization in ("gguf", "gguf+bf16"):
        if not (int4.available() and int8_weights.available()):
            raise ModelLoadError(
                f"quantization={precision.quantization!r} for {spec.path}: this torch has no int4/int8 CPU kernels"
            )
        if precision.quantization == "gguf+bf16" and not packing:
            raise ModelLoadError(f"quantization='gguf+bf16' for {spec.path}: it needs oneDNN's bf16 linear on CPU")
        many_rows_after = precision.quantized_rows if precision.quantization == "gguf+bf16" else None
        lib = gguf_native.load()[0] if precision.gguf_blocks else None
        # the block kernels repack the file's bytes at load (a second or so): nothing to build, nothing to keep
        path = kernel_cache.cache_path(gguf.path) if lib is None else None
        cached = kernel_cache.read(path) if path is not None else None
        built: dict[str, torch.Tensor] = {}
        kinds = from_gguf(model, gguf, packing, many_rows_after, cached, built, lib, precision.dtype)
        if path is not None and cached is None and built:
            kernel_cache.write(path, built)
        return kinds
    prefix = ""
    if precision.quantization == "int8":
        if not int8.applies(device, dtype):
            why = "this torch build has no fbgemm int8 kernels" if not int8.available() else f"not {dtype} on {device}"
            raise ModelLoadError(f"quantization='int8' for {spec.path}: it needs float32 on CPU, {why}")
        prefix = "int8+" if int8.quantize_linears(model) else ""
    packed = packing and onednn.pack_linears(model, (torch.float32, torch.bfloat16))
    return prefix + ("onednn" if packed else "torch")


def from_gguf(
    model: torch.nn.Module,
    gguf: GGUFWeights,
    onednn_ok: bool,
    many_rows_after: int | None = None,
    cached: dict[str, torch.Tensor] | None = None,
    built: dict[str, torch.Tensor] | None = None,
    blocks: gguf_native.Library | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> str:
    """Every linear layer and the embedding from the GGUF's tensors, as `gguf_sourced` said. With
    `many_rows_after` (quantization "gguf+bf16"), each layer also holds its tensor dequantized to
    bf16 and packed for oneDNN, and a call of more rows than that runs on it. The quantized
    kernels come from `cached` where it holds them (kernel_cache.py), and what they hold is put
    in `built`. With the `blocks` library, the tensors it takes are computed from their GGUF blocks
    as they are (gguf_blocks.py)."""
    kinds: set[str] = set()
    unserved: dict[str, int] = {}  # quantized types no kernel takes here: dequantized by the loader
    sourced = gguf_sourced(model, gguf, blocks is not None)
    embed, head, shared = model.get_input_embeddings(), model.get_output_embeddings(), tied_embedding(model)
    dense = many_rows_after is not None
    # by name: a list of the modules themselves would keep every replaced dense weight alive
    for name in [n for n, m in model.named_modules() if m is embed or isinstance(m, torch.nn.Linear)]:
        module = model.get_submodule(name)
        hit = cached is not None and (f"{name}.int4.packed" in cached or f"{name}.int8.qweight" in cached)
        tied_to = shared if module is head else None
        t = gguf_tensor(gguf, name, tied_to, mapped=module is embed or hit)  # a kernel read back needs few bytes
        if t is None or t.kind in FLOATS:
            continue
        if f"{name}.weight" not in sourced:
            unserved[t.kind] = unserved.get(t.kind, 0) + 1
            continue
        owner, _, leaf = name.rpartition(".")
        parent = model.get_submodule(owner)
        if module is embed:
            scale = getattr(module, "embed_scale", None)  # Gemma scales its embeddings in the module
            setattr(parent, leaf, GGUFEmbedding(t, dtype, module.padding_idx, scale))
            kinds.add("gguf-embedding")
            continue
        if blocks is not None:
            data = t.data if t.row_order is None else t.data[t.row_order.numpy()]
            few, kind = gguf_blocks.GGUFBlockLinear(blocks, t.kind, data, (t.rows, t.cols), module.bias), "blocks"
        else:
            few, kind = quantized_kernel(name, t, module.bias, cached or {}, built if built is not None else {})
        kinds.add(kind)
        if dense:
            few = by_rows.ByRowsLinear(few, onednn.PackedLinear(dense_bf16(t, module)), many_rows_after)
            kinds.add("bf16-by-rows")
        setattr(parent, leaf, few)
        del module
        native.trim_heap(collect=False)  # this tensor's scratch goes back now: freed pieces add up to the load's peak
    if onednn_ok and onednn.pack_linears(model, (dtype,)):
        kinds.add("onednn")
    order = ["blocks", "int4", "int8", "bf16-by-rows", "onednn", "gguf-embedding"]
    used = "+".join(k for k in order if k in kinds) or "torch"
    if not unserved:
        return used
    which = ", ".join(f"{n} {kind}" for kind, n in sorted(unserved.items()))
    takes = ", ".join(sorted(gguf_blocks.KINDS if blocks is not None else QUANTIZED))
    log.warning("%s: %s tensors dequantized (the kernels here take %s)", gguf.path.name, which, takes)
    return f"{used} ({which} tensors dequantized: the kernels here take {takes})"


def quantized_kernel(name: str, t, bias, cached: dict, built: dict) -> tuple[torch.nn.Module, str]:
    """The layer's quantized kernel: Q4_K as int4 groups, anything else as int8 per channel; read
    back from `cached` where an earlier load built it, and its tensors put in `built`."""
    if t.kind == "Q4_K" and t.cols % int4.GROUP == 0:
        packed, sz = f"{name}.int4.packed", f"{name}.int4.scales_and_zeros"
        if packed in cached and sz in cached:
            layer = int4.Int4Linear.from_packed(cached[packed], cached[sz], (t.rows, t.cols), bias)
        else:
            layer = int4.Int4Linear(*q4k_groups(t), bias)
        built[packed], built[sz] = layer.packed, layer.scales_and_zeros
        return layer, "int4"
    qweight, scales = f"{name}.int8.qweight", f"{name}.int8.scales"
    if qweight in cached and scales in cached:
        layer = int8_weights.Int8WeightLinear.from_quantized(cached[qweight], cached[scales], bias)
    else:
        rows = lambda a, b: dequantized(t, torch.arange(a, b))  # noqa: E731
        layer = int8_weights.Int8WeightLinear.from_rows(t.rows, t.cols, rows, bias)
    built[qweight], built[scales] = layer.qweight, layer.scales
    return layer, "int8"


def dense_bf16(t, module: torch.nn.Linear) -> torch.nn.Linear:
    """The GGUF tensor as a bf16 `nn.Linear`: the same weights as its quantized kernel's. The
    layer itself where its checkpoint already holds exactly them (the store's conversion of this
    GGUF does: checked on a sample of rows), which saves dequantizing it all again (8 s for the
    demo 1.5B); otherwise dequantized here, 1024 rows at a time (a vocabulary-sized head never
    exists in float32 all at once)."""
    w = module.weight
    if not w.is_meta and w.dtype == torch.bfloat16 and tuple(w.shape) == (t.rows, t.cols):
        sample = torch.linspace(0, t.rows - 1, 16).long().unique()
        if torch.equal(dequantized(t, sample).to(torch.bfloat16), w[sample]):
            return module
    linear = torch.nn.Linear(t.cols, t.rows, bias=False, device="meta")
    weight = torch.empty(t.rows, t.cols, dtype=torch.bfloat16)
    for start in range(0, t.rows, 1024):
        stop = min(start + 1024, t.rows)
        weight[start:stop] = dequantized(t, torch.arange(start, stop))
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.bias = module.bias
    return linear
