"""How to sample one request (`SamplingParams`), and the shapes structured output may take
(`JsonSchema`, `Regex`, `Grammar`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)


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

    max_tokens: int | None = Field(
        256,
        ge=1,
        strict=True,
        description="Most tokens to generate; None: as many as the room the prompt leaves, in the context and "
        "in the smallest KV pool of the models the request may visit (OpenAI's default).",
    )
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
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] = Field(
        default_factory=list, description="Extra token ids that end generation."
    )
    ignore_eos: bool = Field(False, strict=True, description="Keep generating past the model's EOS tokens.")
    include_stop_str_in_output: bool = Field(False, strict=True, description="Keep a matched stop string in the text.")
    skip_special_tokens: bool = Field(True, strict=True, description="Leave special tokens out of the text.")
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any of the three penalties changes the logits."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
