"""Validated configuration: how to sample a request, how to run a model, and how the engine runs
its workers.

All are pydantic models so that bad values fail at construction with the field named.
Numbers and flags are strict: an int field takes an int (not a bool, a float or a numeric
string), a float field takes an int or a float (not a bool or a string, never NaN or an
infinity), and a flag takes a bool (not 0/1 or "yes").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

DType = Literal["auto", "float32", "float64", "bfloat16", "float16"]


class JsonSchema(BaseModel):
    """Output that is one JSON value valid under `json_schema` (None: any JSON object).

    `compact` (default) allows no whitespace between JSON tokens: a grammar that allows any
    whitespace lets a weak model write whitespace until `max_tokens`, as engines warn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: dict[str, Any] | None = Field(None, description="A JSON Schema; None: any JSON object.")
    compact: bool = Field(True, strict=True, description="No whitespace between JSON tokens.")


class Regex(BaseModel):
    """Output that matches a regular expression, whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: StrictStr = Field(min_length=1)


class Grammar(BaseModel):
    """Output in the language of an EBNF grammar (GBNF, as llama.cpp and xgrammar write it), from `root`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ebnf: StrictStr = Field(min_length=1)
    root: StrictStr = Field("root", min_length=1)


ResponseFormat = JsonSchema | Regex | Grammar


def _as_response_format(v):
    """A pydantic model class or a JSON Schema dict means JsonSchema; OpenAI's shapes
    ({"type": "json_schema", "json_schema": {"schema": ...}} and {"type": "json_object"}) too."""
    if v is None or isinstance(v, (JsonSchema, Regex, Grammar)):
        return v
    if isinstance(v, type) and issubclass(v, BaseModel):
        return JsonSchema(json_schema=v.model_json_schema())
    if isinstance(v, Mapping):
        kind = v.get("type")
        if kind == "json_object" and set(v) == {"type"}:
            return JsonSchema()
        if kind == "json_schema" and isinstance(v.get("json_schema"), Mapping):
            inner = v["json_schema"]
            if not isinstance(inner.get("schema"), Mapping):
                raise ValueError("response_format: an OpenAI-style json_schema needs json_schema.schema, a dict")
            return JsonSchema(json_schema=dict(inner["schema"]))
        return JsonSchema(json_schema=dict(v))
    raise ValueError(
        "response_format: must be a JSON Schema dict, a pydantic model class, JsonSchema, Regex or Grammar, "
        f"got {type(v).__name__}"
    )


def _alternatives(description: str):
    """A logprobs field: None (off) or how many alternatives to return per token, 0 to 20 (vLLM's default cap)."""
    return Field(None, ge=0, le=20, strict=True, description=description)


class SamplingParams(BaseModel):
    """How to sample one request. Defaults follow vLLM's except `max_tokens` (256, not 16).

    `temperature=0` is greedy decoding; `top_k=0`, `top_p=1` and `min_p=0` disable those filters.
    Penalties apply first, then temperature and the filters (docs/sampling.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(256, ge=1, strict=True, description="Most tokens to generate.")
    temperature: float = Field(1.0, ge=0.0, le=100.0, allow_inf_nan=False, strict=True, description="0 means greedy.")
    top_k: int = Field(0, ge=0, strict=True, description="Keep the k most likely tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, strict=True, description="Nucleus mass in (0, 1].")
    min_p: float = Field(
        0.0, ge=0.0, le=1.0, allow_inf_nan=False, strict=True, description="Drop tokens below min_p * max prob."
    )
    seed: int | None = Field(
        None, ge=0, lt=2**63, strict=True, description="Per-request seed; same seed, same samples."
    )
    stop: list[StrictStr] = Field(default_factory=list, description="Stop strings; excluded from the text.")
    stop_token_ids: list[StrictInt] = Field(default_factory=list, description="Extra token ids that end generation.")
    ignore_eos: bool = Field(False, strict=True, description="Keep generating past the model's EOS tokens.")
    include_stop_str_in_output: bool = Field(False, strict=True)
    skip_special_tokens: bool = Field(True, strict=True)
    n: int = Field(1, ge=1, le=128, strict=True, description="Samples of the prompt, sharing its KV blocks.")
    response_format: ResponseFormat | None = Field(
        None, description="Constrain the output: a JSON Schema (or pydantic model class), a Regex or a Grammar."
    )

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, v):
        return _as_response_format(v)

    @model_validator(mode="after")
    def _constraint_ends(self) -> SamplingParams:
        if self.response_format is not None and self.ignore_eos:
            raise ValueError("ignore_eos: cannot be combined with response_format (a finished grammar allows only EOS)")
        return self

    repetition_penalty: float = Field(
        1.0,
        gt=0.0,
        allow_inf_nan=False,
        strict=True,
        description="Over prompt and output tokens: a positive logit is divided by it, another multiplied "
        "(transformers' RepetitionPenaltyLogitsProcessor); 1 disables.",
    )
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, allow_inf_nan=False, strict=True, description="Subtracted once from each output token."
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, allow_inf_nan=False, strict=True, description="Subtracted per occurrence in the output."
    )
    logprobs: int | None = _alternatives(
        "Each output token's logprob and its N most likely alternatives; 0: just the token's; None: off."
    )
    prompt_logprobs: int | None = _alternatives(
        "Each prompt token's logprob under the entry model, and N alternatives (no prefix-cache hits)."
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, v):
        if isinstance(v, str):
            return [v]
        return v

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: list[str]) -> list[str]:
        if any(len(s) == 0 for s in v):
            raise ValueError("stop strings must be non-empty")
        for s in v:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"stop string {s!r} is not valid Unicode (a lone surrogate)") from None
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _ids_non_negative(cls, v: list[int]) -> list[int]:
        if any(i < 0 for i in v):
            raise ValueError("stop_token_ids must be >= 0")
        return v

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any of the three penalties changes the logits."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


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
    path: Path
    dtype: DType = Field("auto", description="'auto' is float32 on CPU and the checkpoint's dtype on GPU.")
    device: str = "cpu"
    tokenizer: Path | None = Field(None, description="Tokenizer directory if not beside the weights.")
    kv_cache_tokens: int | None = Field(None, ge=1, strict=True)
    kv_cache_bytes: int | None = Field(None, ge=1, strict=True)
    block_size: int = Field(16, ge=1, le=1024, strict=True)
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
        description="Float32 CPU linear layers through oneDNN, weights reordered once at load (decode steps "
        "about 2x faster on CPU). None: wherever it applies; True: required; False: torch's default path.",
    )
    quantization: Literal["int8"] | None = Field(
        None,
        description="'int8': the linear layers (but the MLP output projections) with int8 weights and "
        "per-step int8 activations, CPU float32 only (engine/model/linear/int8.py): a decode step reads a "
        "quarter of the weight bytes. Lossy: meant for a draft model, whose tokens a verifying policy "
        "checks. None: the weights as loaded.",
    )

    attention_backend: Literal["auto", "torch", "flashinfer"] = Field(
        "auto",
        description="'auto': flashinfer's paged kernels on CUDA in float16/bfloat16 when the `gpu` extra is "
        "installed, else torch's. 'flashinfer' requires it; 'torch' runs anywhere.",
    )
    cuda_graph_max_batch: int = Field(
        32,
        ge=0,
        le=4096,
        strict=True,
        description="With flashinfer, decode steps of up to this many requests replay CUDA graphs captured at "
        "start (sizes 1, 2, 4, 8, then every 8); 0 runs every step eagerly.",
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
        from . import store
        from .errors import ModelLoadError

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
            from .store import MODELS

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
        if self.quantization is not None and (
            self.device.split(":")[0] != "cpu" or self.dtype not in ("auto", "float32")
        ):
            raise ValueError(
                f"quantization={self.quantization!r} runs on device 'cpu' in float32 only, "
                f"not device={self.device!r} with dtype={self.dtype!r}"
            )
        return self

    @classmethod
    def coerce(cls, value: str | Path | ModelSpec) -> ModelSpec:
        if isinstance(value, ModelSpec):
            return value
        if isinstance(value, (str, Path)):
            return cls(path=value)
        raise TypeError(f"a model must be a path or a ModelSpec, got {type(value).__name__}")


class AutoBatchingOptions(BaseModel):
    """The knobs of delayed_batching="auto" (`autobatch/controller.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(
        1.0, gt=0.0, allow_inf_nan=False, strict=True, description="Seconds between re-picks of B."
    )
    latency_bound_s: float | None = Field(
        None, gt=0.0, allow_inf_nan=False, strict=True, description="A bound on the predicted per-token latency."
    )
    shared_device: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        strict=True,
        description="Share sigma of device time the models' steps contend for; None: 1 on one GPU, on CPU from "
        "the worker threads per core, 0 on separate devices.",
    )


BatchSize = Annotated[int, Field(ge=1, strict=True)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False, strict=True)]


class EngineOptions(BaseModel):
    """How an `Engine` runs its workers: its keyword arguments, checked when it is constructed.
    Each field's description is the one statement of the option (docs/sdk.md shows them, and a
    test keeps that table equal to these). Errors name the argument (the `Engine` raises them as
    `ConfigError`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_threads: StrictInt | None = Field(
        None,
        ge=1,
        description="torch's intra-op threads of each worker thread (the caller's own thread is left alone). "
        "None: workers on CPU take turns, each step alone on every core (engine/worker/cpu_turns.py).",
    )
    delayed_batching: BatchSize | dict[str, BatchSize] | Literal["auto"] | None = Field(
        None,
        description="B, one int or per model: a worker waits (at most batch_wait_s) until B requests are ready "
        "before it steps, so hand-offs do not fragment batches. None: B = 1. 'auto': B from the throughput model "
        "(autobatch/), re-picked as routing is observed.",
    )
    batch_wait_s: Seconds = Field(0.02, description="The most a worker holds back waiting for B ready requests.")
    mode: Literal["routed", "standard", "lockstep"] = Field(
        "routed",
        description="'routed' (this engine), or a baseline that speed is measured against: 'standard' (a hand-off "
        "goes back to the caller and is re-sent as a new request with the whole sequence) or 'lockstep' (one "
        "thread steps each model's batch in turn).",
    )
    stop_timeout: Seconds = Field(30.0, gt=0.0, description="The most close() waits for the workers to stop.")
    auto_batching: AutoBatchingOptions | None = Field(
        None, description="The knobs of delayed_batching='auto' (AutoBatchingOptions); None: their defaults."
    )
    ray_address: StrictStr | None = Field(
        None,
        description="With placed models: the Ray cluster to use ('auto', 'host:port', 'ray://...'), or 'local' to "
        "start one for this engine; None: the one this process is connected to, else the one `ray start` runs here.",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = Field(
        None,
        description="Put the placed models' actors in one placement group with this strategy (STRICT_PACK: one "
        "node; SPREAD: apart if possible); None: each actor is scheduled on its own resources.",
    )

    @field_validator("ray_address")
    @classmethod
    def _address(cls, v):
        if v is not None and (not v.strip() or any(c.isspace() for c in v)):
            raise ValueError(f"ray_address: must be 'local', 'auto', 'host:port' or 'ray://host:port', got {v!r}")
        return v

    @field_validator("delayed_batching", mode="before")
    @classmethod
    def _batch_min(cls, v, info):
        """One message for the union (pydantic's would list every member), and only known models."""
        if v is None or (isinstance(v, str) and v == "auto"):
            return v
        models = (info.context or {}).get("models")
        if isinstance(v, Mapping):
            unknown = sorted(set(v) - set(models), key=repr) if models is not None else []
            if unknown:
                raise ValueError(f"delayed_batching: names unknown model(s) {unknown}")
            values = dict(v)
        elif isinstance(v, str):
            raise ValueError(
                f"delayed_batching: must be 'auto', None, an int >= 1 or a dict of model -> int >= 1, got {v!r}"
            )
        else:
            values = {"": v}
        for name, b in values.items():
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                which = f" for model {name!r}" if name else ""
                raise ValueError(f"delayed_batching: B{which} must be an int >= 1, got {b!r}")
        return v

    @property
    def auto_batching_options(self) -> AutoBatchingOptions:
        return self.auto_batching or AutoBatchingOptions()

    def batch_min(self, models: list[str]) -> dict[str, int]:
        """B per model (1 where none is given, and under 'auto' until the controller picks)."""
        db = self.delayed_batching
        if db is None or db == "auto":
            return dict.fromkeys(models, 1)
        if isinstance(db, dict):
            return {m: db.get(m, 1) for m in models}
        return dict.fromkeys(models, db)
