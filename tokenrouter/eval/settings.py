"""What a run is asked to do, validated before anything loads (pydantic: a bad value names its field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvalSettings(BaseModel):
    """The knobs of one evaluation run. Those that change the numbers (max_tokens, precision, the
    sandbox's timeout and memory) are recorded in results.jsonl and must match on --resume."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(512, ge=1, le=32768, strict=True, description="Most tokens per answer.")
    concurrency: int = Field(16, ge=1, le=4096, strict=True, description="Problems in flight at once.")
    timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False, description="Sandbox wall-clock limit.")
    memory_mb: int = Field(2048, ge=64, strict=True, description="Sandbox address-space limit.")
    speed_requests: int | None = Field(
        None, ge=0, strict=True, description="Requests of the speed phase; None: 2 x concurrency; 0: no speed phase."
    )
    speed_rounds: int = Field(
        3, ge=1, le=100, strict=True, description="Speed-phase runs per system, the systems taking turns each round."
    )
    remeasure_speed: bool = Field(False, strict=True, description="Measure every round again though measured.")
    kv_cache_tokens: int | None = Field(None, ge=1, strict=True, description="Per model; None: enough for C answers.")
    threads: int | None = Field(None, ge=1, strict=True, description="torch threads per worker; None: turns.")
    device: str = "cpu"
    precision: Literal["auto", "float32", "bfloat16", "gguf", "gguf+bf16"] = Field(
        "auto", description="What the models compute in (the command line's --precision); auto: the API's default."
    )
    sandbox_workers: int = Field(2, ge=1, le=256, strict=True, description="Programs tested at once.")

    @property
    def speed_count(self) -> int:
        return 2 * self.concurrency if self.speed_requests is None else self.speed_requests

    def kv_tokens(self, prompt_tokens: int = 1024) -> int:
        """A KV budget that holds C answers at once (prompts of up to `prompt_tokens`)."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        need = self.concurrency * (prompt_tokens + self.max_tokens)
        return max(8192, -(-need // 1024) * 1024)
