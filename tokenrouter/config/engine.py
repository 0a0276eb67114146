"""How an `Engine` runs its workers (`EngineOptions`), and the knobs of its throughput model
(`AutoBatchingOptions`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)


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
    deterministic: StrictBool = Field(
        False,
        description="Every model with ModelSpec(deterministic=True): only kernels whose result for a row is the same "
        "bits in a step of any size, so a request's tokens never depend on what else is in flight; a model whose "
        "settings need another kernel is refused, naming the setting (docs/policies.md, 'Same tokens at any load').",
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
