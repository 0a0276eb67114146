"""What a model computes in: its dtype, and whether its weights stay quantized.

- `quantization="auto"` (the default) is the one rule every way of naming a model goes through:
  on CPU with `dtype="auto"`, a GGUF-backed model (a `.gguf` path, a store model, a directory
  holding a GGUF) resolves as `gguf+bf16` below: its blocks where the probe says they win;
  anything else (no GGUF, a GPU, a dtype asked for) as `None`: the dense weights.

- On a GPU, the checkpoint's dtype; a float32 or float64 checkpoint maps to bfloat16 (float16 on
  a GPU without bfloat16), as vLLM does, said in the log (`gpu_dtype`).
- On CPU with `dtype="auto"`, the faster of float32 and bfloat16 for this model on this machine,
  measured (`quant/probe.py`).
- `quantization="gguf"` computes a GGUF checkpoint's quantized tensors from the file's own blocks
  (the GGUF block kernels, where a probe measures them faster than torch's) or as torch's 4-bit
  and int8 kernels (`quant/kernels.py`). The block kernels round x to int8 themselves and take
  float32 as fast as bf16, so around them the model computes in float32 over a float16 KV cache,
  as llama.cpp does (`float32_blocks`; `dtype="bfloat16"` keeps bf16); torch's kernels take
  bfloat16, so around them it computes in bf16. Where bf16 is not the faster dtype (no native
  bf16 on this CPU) `dtype="auto"` takes the block kernels in float32 where a probe measured them
  faster than float32 dense at every size, or at one row: a generation is mostly decode steps,
  and float32 weights take several times the GGUF's memory (about 7x for Q4_K: 11 GB for the demo
  pair), so the plain C kernels serve though they prefill slower than float32 would. Where they
  lose even at one row it falls back to float32 with the weights dequantized, and says why.
- `quantization="gguf+bf16"` holds both the GGUF's kernels and dense bf16 weights, and a call
  takes the quantized ones up to the rows where a probe found them faster (`quant/by_rows.py`);
  where the probe found them faster at every size it measures (the GGUF block kernels on an
  AVX512 VNNI CPU), the bf16 copies would compute nothing faster, and it runs as `gguf` (float32
  activations around the block kernels). It falls back to float32 as `gguf` does.
- `quantization="int8"` (a drafter's dynamic int8) computes in float32, as its kernels need.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ...config import ModelSpec
from .. import native
from . import gguf_native, probe

log = logging.getLogger(__name__)

GGUF_MODES = ("gguf", "gguf+bf16")

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype
    quantization: str | None  # "gguf", "gguf+bf16", "int8" or None
    reason: str  # one line: what was chosen and why
    quantized_rows: int = 0  # gguf+bf16: calls of up to this many rows use the quantized weights
    gguf_blocks: bool = False  # gguf modes: the GGUF block kernels (native/gguf/) serve what they take
    kv_dtype: torch.dtype | None = None  # what the KV cache holds, where not `dtype`

    @property
    def kv(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        kv = f", KV {_name(self.kv)}" if self.kv != self.dtype else ""
        return f"{name}{' + ' + self.quantization if self.quantization else ''}{kv} ({self.reason})"


def stored_dtype(config) -> torch.dtype | None:
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = DTYPES.get(stored)
    return stored if isinstance(stored, torch.dtype) and stored.is_floating_point else None


def gpu_dtype(stored: torch.dtype | None, bf16: bool) -> tuple[torch.dtype, str]:
    """What dtype="auto" computes in on a GPU, and why: a float16 or bfloat16 checkpoint as it is;
    a float32 or float64 one (or one that states no dtype) in bfloat16, or float16 on a GPU
    without bfloat16 (`bf16`), as vLLM does: half precision is what GPUs compute fast, and what
    flashinfer's kernels and CUDA graphs serve."""
    half = torch.bfloat16 if bf16 else torch.float16
    if stored is None:
        return half, f"the checkpoint states no dtype: {_name(half)} on the GPU"
    if stored in (torch.float16, torch.bfloat16):
        return stored, "the checkpoint's dtype"
    return half, f"the {_name(stored)} checkpoint mapped to {_name(half)} on the GPU"


def bf16_supported(device: torch.device) -> bool:
    """Whether a CUDA device computes bfloat16 natively (compute capability 8.0 and up; other devices: assumed)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def asked_quantization(spec: ModelSpec, device: torch.device, gguf: bool) -> str | None:
    """What `spec.quantization` means for this checkpoint (`gguf`: it has a GGUF) on this device:
    "auto" becomes "gguf+bf16" for a GGUF-backed model on CPU with dtype "auto" ("gguf" where
    `deterministic`: no bf16 copies for big steps), else None."""
    if spec.quantization != "auto":
        return spec.quantization
    if gguf and device.type == "cpu" and spec.dtype == "auto":
        return "gguf" if spec.deterministic else "gguf+bf16"
    return None


def resolve_precision(
    spec: ModelSpec, config, device: torch.device, threads: int | None, gguf_kind: str | None = None
) -> Precision:
    """What the model computes in on `device`. `gguf_kind`: the GGUF type most of the checkpoint's
    weights are in (the probe times the block kernels on it), None where it has no GGUF."""
    quantization = asked_quantization(spec, device, gguf_kind is not None)
    if device.type != "cpu":
        if spec.dtype != "auto":
            return Precision(DTYPES[spec.dtype], None, "as asked")
        stored = stored_dtype(config)
        dtype, reason = gpu_dtype(stored, bf16_supported(device))
        if stored is not None and dtype != stored:
            log.info("%s: the %s checkpoint computes in %s on %s", spec.path, _name(stored), _name(dtype), device)
        return Precision(dtype, None, reason)
    chosen = cpu_precision(spec, config, threads, gguf_kind, quantization)
    return replace(chosen, reason=f"{chosen.reason}; CPU level {native.cpu.current().describe()}")


def cpu_precision(
    spec: ModelSpec, config, threads: int | None, gguf_kind: str | None, quantization: str | None
) -> Precision:
    """`resolve_precision` on the CPU, before it names the CPU level."""
    if quantization == "int8":
        return Precision(torch.float32, "int8", "int8 kernels take float32 activations")
    gguf = quantization in GGUF_MODES
    if quantization == "gguf" and spec.dtype == "float32":
        lib, missing = gguf_native.load()
        if lib is None:
            return Precision(torch.float32, None, f"float32 weights: the GGUF block kernels are not here: {missing}")
        return float32_blocks(f"float32 as asked, the GGUF block kernels at CPU level {lib.level}")
    if spec.dtype != "auto" and not (gguf and spec.dtype == "bfloat16"):
        return Precision(DTYPES[spec.dtype], quantization, "as asked")
    threads = threads or torch.get_num_threads()
    shapes = probe.probe_shapes(meta_model(config))
    if spec.dtype == "auto":
        choice = probe.precision_for(shapes, threads)
        if not gguf or choice.dtype != "bfloat16":
            if not gguf:
                return Precision(choice.torch_dtype, None, choice.reason)
            timings = probe.quantized_rows(shapes[0], threads, kind=gguf_kind, dense="float32")[1]
            most = max(probe.QUANTIZED_ROWS)
            if probe.blocks_beat_float32(timings):  # no bf16 needed: x reaches them in float32
                why = f"the GGUF block kernels measured faster than float32 at every size up to {most} rows"
                return float32_blocks(f"{why}; {choice.reason}")
            if probe.blocks_beat_float32(timings, rows=(1,)):  # decode: the steps a generation is made of
                why = (
                    f"the GGUF block kernels measured faster than float32 at one row (decode), slower at up to "
                    f"{most} (prefill): they serve, as float32 weights would take {float32_growth(gguf_kind)} "
                    "the GGUF's memory; quantization=None takes float32 weights"
                )
                return float32_blocks(f"{why}; {choice.reason}")
            why = f"quantization={quantization!r} falls back to float32 weights: {choice.reason}"
            return Precision(torch.float32, None, why)
        reason = choice.reason
    else:
        reason = "bfloat16 as asked"
    rows, timings = probe.quantized_rows(
        shapes[0], threads, kind=gguf_kind
    )  # which quantized kernel, and up to what rows
    few = probe.few_kernel(timings)
    blocks = few == "blocks"
    kernel = "the GGUF block kernels" if blocks else f"torch's {few} kernels"
    most = max(probe.QUANTIZED_ROWS)
    refused = native.cpu.current().torch_bf16  # oneDNN's bf16 linear, which bf16 copies compute with
    if quantization == "gguf" or rows >= most or refused:  # no bf16 copies: asked, no faster, or cannot run
        if quantization == "gguf":
            why = f"{kernel} for the quantized layers"
        elif refused:
            why = f"{kernel} at every size, no bf16 copies ({refused})"
        else:
            why = f"{kernel} measured faster than bf16 at every size up to {most} rows: no bf16 copies"
        if blocks and spec.dtype == "auto":  # they take float32 x as fast: nothing between them in bf16
            return float32_blocks(why)
        return Precision(torch.bfloat16, "gguf", f"{why}; bf16 between them; {reason}", gguf_blocks=blocks)
    why = f"{kernel} up to {rows} rows, measured faster than bf16 there; {reason}"
    return Precision(torch.bfloat16, "gguf+bf16", why, quantized_rows=rows, gguf_blocks=blocks)


def float32_growth(kind: str | None) -> str:
    """How many times a GGUF type's memory its weights take as float32 ("about 7x" for Q4_K)."""
    values, size = gguf_native.BLOCKS.get(kind or "Q4_K", gguf_native.BLOCKS["Q4_K"])
    return f"about {32 * values / (8 * size):.0f}x"


def float32_blocks(why: str) -> Precision:
    """The GGUF block kernels for the quantized layers, float32 activations between them and a
    float16 KV cache, as llama.cpp computes: the kernels round x to int8 per block whatever dtype
    it comes in, and are as fast from float32, while a residual stream and KV rounded to bf16 cost
    the 0.5B 3 HumanEval points (docs/evaluation.md). Needs no bf16 at all."""
    return Precision(torch.float32, "gguf", f"{why}; float32 between them", gguf_blocks=True, kv_dtype=torch.float16)


def meta_model(config) -> torch.nn.Module:
    """The model built on the meta device: its shapes, without weights."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=True):
        return AutoModelForCausalLM.from_config(config)
