"""How to run one model (`ModelSpec`), and where its worker runs when not in the caller's
process (`RayPlacement`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

DType = Literal["auto", "float32", "float64", "bfloat16", "float16"]


class RayPlacement(BaseModel):
    """Where a model's worker runs when it is not in the caller's process: a Ray actor holding
    these resources (docs/distributed.md). Ray schedules it on a node that has them, so a custom
    resource that only one node offers (`ray start --resources='{"gpu_node": 1}'`) pins it there.

    The actor's torch threads are the engine's `num_threads` if given, else `num_cpus` (at least
    one): the CPUs it reserved. `runtime_env` is Ray's, merged with what the engine sets
    (`HF_HUB_OFFLINE=1`, and `PYTHONPATH` led by the directory this tokenrouter was imported
    from, so that actors on this machine run the caller's code)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_cpus: float = Field(
        1.0, ge=0.0, le=1024.0, allow_inf_nan=False, strict=True, description="CPUs the actor reserves."
    )
    num_gpus: float = Field(
        0.0, ge=0.0, le=64.0, allow_inf_nan=False, strict=True, description="GPUs the actor reserves."
    )
    resources: dict[StrictStr, float] = Field(
        default_factory=dict, description="Custom resources the actor needs, e.g. {'node_large': 1}."
    )
    runtime_env: dict[StrictStr, Any] | None = Field(None, description="Ray's runtime_env for the actor.")

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if not name.strip():
                raise ValueError("resources: a resource name must be a non-empty string")
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources: give {name!r} as num_cpus / num_gpus, not as a custom resource")
            if isinstance(amount, bool) or not (0 < amount < float("inf")):
                raise ValueError(f"resources: {name!r} must be a finite number > 0, got {amount!r}")
        return v

    @field_validator("resources", mode="before")
    @classmethod
    def _amounts_are_numbers(cls, v):
        if isinstance(v, Mapping):
            for name, amount in v.items():
                if isinstance(amount, bool) or not isinstance(amount, (int, float)):
                    raise ValueError(f"resources: {name!r} must be a number, got {type(amount).__name__}")
        return v

    @field_validator("runtime_env")
    @classmethod
    def _env(cls, v: dict | None) -> dict | None:
        env = (v or {}).get("env_vars")
        if env is not None and (
            not isinstance(env, Mapping) or not all(isinstance(x, str) for kv in env.items() for x in kv)
        ):
            raise ValueError("runtime_env: env_vars must be a dict of str -> str")
        return v

    def actor_options(self) -> dict:
        """The Ray actor options these resources mean (resources and runtime_env are added by the engine)."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources)}

    @property
    def bundle(self) -> dict[str, float]:
        """This actor's bundle in a placement group."""
        out = {"CPU": self.num_cpus, **self.resources}
        if self.num_gpus:
            out["GPU"] = self.num_gpus
        return {k: v for k, v in out.items() if v > 0} or {"CPU": 0.001}


class ModelSpec(BaseModel):
    """One model and the worker that serves it.

    `path` is a Hugging Face model directory (config.json + safetensors + tokenizer), a `.gguf`
    file, or the name of a model in the local store (`tokenrouter models`). The KV budget is
    explicit: `kv_cache_tokens` or `kv_cache_bytes` (never a fraction of free memory); with
    neither, `kv_cache_tokens` defaults to 16384.

    `placement` (a `RayPlacement`) runs the model's worker in a Ray actor instead of the caller's
    process (docs/distributed.md). Its `path` and `tokenizer` are then looked up on the node the
    actor runs on, not here: a large model's weights need only be where its GPUs are.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # First, so that the path checks below know whether the path is local (pydantic validates
    # fields in this order and hands the earlier ones to later validators).
    placement: RayPlacement | None = Field(
        None, description="None: the worker runs in the caller's process; else in a Ray actor with these resources."
    )
    path: Path = Field(
        description="A Hugging Face model directory, a .gguf file, or the name of a store model (`tokenrouter models`)."
    )
    dtype: DType = Field(
        "auto",
        description="'auto': on CPU the faster of float32 and bfloat16 for this model on this machine, measured "
        "once and cached (engine/quant/probe.py); on GPU the checkpoint's dtype, a float32 or float64 one in "
        "bfloat16 (float16 on a GPU without it).",
    )
    device: str = Field("cpu", description="A torch device: 'cpu', 'cuda', 'cuda:1', ...")
    tokenizer: Path | None = Field(None, description="Tokenizer directory if not beside the weights.")
    kv_cache_tokens: int | None = Field(
        None, ge=1, strict=True, description="The KV pool's size in tokens (16384 when neither budget is given)."
    )
    kv_cache_bytes: int | None = Field(
        None, ge=1, strict=True, description="The KV pool's size in bytes, instead of kv_cache_tokens."
    )
    block_size: int = Field(16, ge=1, le=1024, strict=True, description="Tokens per KV block.")
    max_num_seqs: int = Field(64, ge=1, le=4096, strict=True, description="Most requests in one batch.")
    max_num_batched_tokens: int = Field(
        512, ge=1, strict=True, description="Token budget of one step (chunked prefill)."
    )
    max_model_len: int | None = Field(
        None, ge=2, strict=True, description="Context limit; default from the model config."
    )
    enable_prefix_caching: bool = Field(
        True, strict=True, description="Share KV blocks of common prefixes between requests."
    )
    onednn_linear: bool | None = Field(
        None,
        strict=True,
        description="CPU linear layers (float32 or bfloat16) through oneDNN, weights reordered once at load "
        "(decode steps about 2x faster on CPU). None: wherever it applies; True: required; False: torch's path.",
    )
    quantization: Literal["auto", "gguf", "gguf+bf16", "int8"] | None = Field(
        "auto",
        description="'auto': on CPU with dtype 'auto', a GGUF-backed model (a .gguf path, a store model, a "
        "directory holding a GGUF) runs as 'gguf+bf16' does (its GGUF's blocks where a probe measured them "
        "faster); anything else (no GGUF, a GPU, a dtype asked for) as None. "
        "'gguf': the weights as the model's GGUF holds them. Where the GGUF block kernels (built for this "
        "CPU's level: AVX512 VNNI, AVX2 or plain C) are measured faster, each quantized tensor is computed from "
        "its own blocks as llama.cpp does (Q4_0, Q4_1, Q5_0, Q8_0, "
        "Q4_K, Q5_K, Q6_K; other types dequantized), with float32 activations and a float16 KV cache between "
        "them (dtype 'auto' or 'float32'; 'bfloat16' keeps bf16 activations); elsewhere Q4_K tensors 4-bit and "
        "other quantized ones int8 in torch's kernels, computed in bfloat16. Where bfloat16 is not faster on "
        "this CPU, dtype 'auto' keeps the block kernels in float32 where a probe measured them faster than "
        "float32 weights at every size or at one row (decode; float32 weights take several times the "
        "memory), else falls back to float32 weights (engine/quant/precision.py). "
        "'gguf+bf16': the same for steps of few rows, and dense bf16 copies of the weights for steps of many "
        "(prefill, big batches), up to the rows a probe measured (engine/quant/by_rows.py); none where "
        "the quantized kernels were faster at every size. "
        "'int8': the linear layers (but the MLP output projections) with int8 weights and per-step int8 "
        "activations, float32 on CPU (engine/quant/int8.py); lossy, meant for a draft model whose "
        "tokens a verifying policy checks. None: dense weights in `dtype` (a GGUF's dense copy, written once).",
    )
    draft_vocab: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Score only the first N token ids in the output head (a BPE vocabulary's commonest "
        "tokens), the rest -inf: a cheaper draft step (FR-Spec). For a draft model whose tokens a verifying "
        "policy checks (Speculative), where it is lossless; any other use restricts the model's output. "
        "Applies to a head on the GGUF block kernels or a dense one (else the full head serves, with a "
        "warning). None: the whole vocabulary.",
    )

    attention_backend: Literal["auto", "torch", "cpu", "flashinfer"] = Field(
        "auto",
        description="'auto': flashinfer's paged kernels on CUDA in float16/bfloat16 when the `gpu` extra is "
        "installed, imports, and passes its load-time self-test; on CPU tokenrouter's C kernel when it "
        "builds (a C compiler; float32/bfloat16; vector loops at the CPU levels avx2 and avx512, plain C "
        "below), whose result for a token is the same bits in any step; else torch's "
        "(`stats().attention_fallback` says why). 'flashinfer' and 'cpu' require theirs (a failure fails the "
        "load); 'torch' runs anywhere.",
    )
    prefill_backend: Literal["auto", "fa2", "fa3"] = Field(
        "auto",
        description="With flashinfer, the prefill kernels' generation, as flashinfer's `backend=`: 'auto' "
        "(flashinfer 0.7.4: FA3 on Hopper for steps whose longest prefill row is over 64 tokens, FA2 "
        "otherwise), 'fa2' or 'fa3'. 'fa2' where FA3 does not build.",
    )
    cuda_graph_max_batch: int = Field(
        32,
        ge=0,
        le=4096,
        strict=True,
        description="With flashinfer, decode steps of up to this many requests replay CUDA graphs captured at "
        "start (sizes 1, 2, 4, 8, then every 8); 0 runs every step eagerly.",
    )

    deterministic: bool = Field(
        False,
        strict=True,
        description="Only kernels whose result for a row is the same bits in a step of any size, so a "
        "request's tokens never depend on what else is in flight (docs/policies.md, 'Same tokens at any load'): "
        "tokenrouter's C attention kernel, oneDNN's packed linears or the GGUF's kernels, and no bf16 copies for "
        "big steps ('auto' resolves as 'gguf' does where it would be 'gguf+bf16'); refused on a GPU (not measured "
        "there), with torch's or flashinfer's attention, onednn_linear=False, dtype float16 or float64, and "
        "quantization 'gguf+bf16' or 'int8'. False: the default kernels, which hold it too except where the "
        "docs say. Engine(deterministic=True) sets it for every model.",
    )

    @field_validator("path", "tokenizer", mode="before")
    @classmethod
    def _not_empty(cls, v):
        """An empty string would become Path("."), the current directory: almost surely a mistake."""
        if isinstance(v, str) and not v.strip():
            raise ValueError("is empty (it would mean the current directory)")
        return v

    @field_validator("path", mode="before")
    @classmethod
    def _store_name(cls, v, info: ValidationInfo):
        """A store name ("qwen-coder-0.5b") that is not also a local path means the store's copy
        (for a placed model, the store of the node its actor runs on: resolved there)."""
        from .. import store
        from ..errors import ModelLoadError

        if info.data.get("placement") is not None:
            return v
        if isinstance(v, (str, Path)) and str(v) in store.MODELS:
            try:
                return store.locate_model(v)
            except ModelLoadError as e:  # pydantic reports a ValueError with the field name
                raise ValueError(str(e)) from None
        return v

    @field_validator("path", "tokenizer")
    @classmethod
    def _path_exists(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if info.data.get("placement") is not None:  # checked on the actor's node, when it loads
            return v
        if v is not None and not Path(v).exists():
            from ..store import MODELS

            raise ValueError(f"path does not exist: {v} (nor is it a store model: {', '.join(MODELS)})")
        return v

    @field_validator("device")
    @classmethod
    def _device_known(cls, v: str) -> str:
        import torch

        try:
            torch.device(v)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"not a torch device: {v!r}") from e
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> ModelSpec:
        if self.kv_cache_tokens is not None and self.kv_cache_bytes is not None:
            raise ValueError("give kv_cache_tokens or kv_cache_bytes, not both")
        dtypes = {
            "int8": ("auto", "float32"),
            "gguf": ("auto", "bfloat16", "float32"),
            "gguf+bf16": ("auto", "bfloat16"),
        }.get(self.quantization or "")
        if dtypes is not None and (self.device.split(":")[0] != "cpu" or self.dtype not in dtypes):
            raise ValueError(
                f"quantization={self.quantization!r} runs on device 'cpu' with dtype "
                f"{', '.join(dtypes[:-1])} or {dtypes[-1]}, "
                f"not device={self.device!r} with dtype={self.dtype!r}"
            )
        return self

    @model_validator(mode="after")
    def _deterministic_kernels(self) -> ModelSpec:
        """deterministic=True with a setting that needs a kernel whose rows depend on the step."""
        if not self.deterministic:
            return self
        conflicts = {
            "device": (self.device.split(":")[0] != "cpu", "the GPU kernels' batch invariance is not measured"),
            "attention_backend": (
                self.attention_backend in ("torch", "flashinfer"),
                "only tokenrouter's C attention kernel computes a query alike in every step",
            ),
            "onednn_linear": (
                self.onednn_linear is False,
                "torch's own linear gives a row other bits in a bigger step",
            ),
            "dtype": (
                self.dtype in ("float16", "float64"),
                "torch's own linear computes it (oneDNN's takes float32 and bfloat16)",
            ),
            "quantization": (
                self.quantization in ("gguf+bf16", "int8"),
                "'gguf+bf16' switches kernels by the step's rows; 'int8' scales each step's activations as one",
            ),
        }
        for name, (bad, why) in conflicts.items():
            if bad:
                raise ValueError(f"deterministic=True with {name}={getattr(self, name)!r}: {why}")
        return self

    @classmethod
    def coerce(cls, value: str | Path | ModelSpec) -> ModelSpec:
        if isinstance(value, ModelSpec):
            return value
        if isinstance(value, (str, Path)):
            return cls(path=value)
        raise TypeError(f"a model must be a path or a ModelSpec, got {type(value).__name__}")
