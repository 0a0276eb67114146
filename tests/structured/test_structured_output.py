"""Structured output: sampled generations on the routed tiny pair always parse and validate
(JSON schemas, a regex, an EBNF grammar), the constraint holds across hand-offs and under a
verifying policy's rollbacks, requests without a constraint are untouched, and a bad schema
fails its request before anything runs."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import EveryK, serve_all
from tokenrouter import Engine, InvalidRequestError, ModelSpec, RStitch, SamplingParams, Single
from tokenrouter.config import Grammar, JsonSchema, Regex
from tokenrouter.policies import Speculative

SAMPLES = 100


class Owner(BaseModel):
    name: str = Field(pattern=r"^[a-z]{1,8}$")
    verified: bool


class Pet(BaseModel):  # nested objects and an enum
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    owner: Owner


class Tags(BaseModel):  # arrays of enums and of bounded integers, an optional field
    tags: list[Literal["red", "green", "blue"]] = Field(max_length=4)
    scores: list[Annotated[int, Field(ge=0, le=9)]] = Field(min_length=1, max_length=3)
    note: Literal["ok", "late"] | None = None


POINTS_SCHEMA = {  # a JSON Schema dict: an array of objects, a nullable enum
    "type": "object",
    "properties": {
        "points": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "boolean"}},
                "required": ["x", "y"],
            },
            "maxItems": 3,
        },
        "label": {"enum": ["up", "down", None]},
    },
    "required": ["points", "label"],
}


class Point(BaseModel):
    model_config = {"extra": "forbid"}
    x: int = Field(ge=-9, le=9)
    y: bool


class Points(BaseModel):
    model_config = {"extra": "forbid"}
    points: list[Point] = Field(max_length=3)
    label: Literal["up", "down"] | None


REGEX = r"(yes|no)-[0-9]{2,4}(\.[a-f]{1,3})?"
EBNF = 'root ::= num (op num){0,3}\nop ::= " + " | " * "\nnum ::= [1-9] [0-9]?'
EBNF_AS_REGEX = r"[1-9][0-9]?(( \+ | \* )[1-9][0-9]?){0,3}"


def _specs(pair, **kw):
    return {m: ModelSpec(path=p, **kw) for m, p in pair.items()}


def _sampled(fmt, n=SAMPLES, max_tokens=200):
    return [
        SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=max_tokens, response_format=fmt) for i in range(n)
    ]


def _serve(specs, policy, prompts, params):
    return serve_all(specs, policy, prompts, params)


@pytest.mark.parametrize(
    "fmt, model",
    [(Pet, Pet), (Tags, Tags), (POINTS_SCHEMA, Points)],
    ids=["nested-enum", "arrays", "schema-dict"],
)
def test_sampled_json_always_validates_across_handoffs(tiny_pair, fmt, model):
    """The request changes model every 3 tokens: each worker's matcher catches up on the tokens
    the other wrote."""
    params = _sampled(fmt)
    outs = _serve(_specs(tiny_pair), EveryK(3), ["Answer in JSON:"] * SAMPLES, params)
    for out in outs:
        assert out.finish_reason == "stop", (out.finish_reason, out.text)
        model.model_validate_json(out.text, strict=False)  # raises if it does not parse or validate
        json.loads(out.text)  # strict JSON (no raw control characters)
    counts = {m: sum(o.tokens_per_model().get(m, 0) for o in outs) for m in ("small", "large")}
    assert counts["small"] > 0 and counts["large"] > 0, counts  # both models wrote constrained tokens
    assert all(o.num_handoffs >= len(o.token_ids) // 3 - 1 for o in outs), "a hand-off every 3 tokens"
    assert len({o.text for o in outs}) > 2, "sampled, not one answer repeated"


@pytest.mark.parametrize(
    "fmt, pattern", [(Regex(pattern=REGEX), REGEX), (Grammar(ebnf=EBNF), EBNF_AS_REGEX)], ids=["regex", "ebnf"]
)
def test_sampled_regex_and_grammar_always_match(tiny_pair, fmt, pattern):
    outs = _serve(_specs(tiny_pair), EveryK(2), ["Say it:"] * SAMPLES, _sampled(fmt))
    for out in outs:
        assert out.finish_reason == "stop", (out.finish_reason, out.text)
        assert re.fullmatch(pattern, out.text), out.text
    assert all(o.num_handoffs >= len(o.token_ids) // 2 - 1 for o in outs)
    assert len({o.text for o in outs}) > 2


def test_unconstrained_neighbours_are_bit_identical(tiny_pair):
    prompts = [f"Tell me about {w}." for w in ("cats", "dogs", "fish", "birds", "snakes", "frogs")]
    free = [SamplingParams(temperature=1.0, seed=7 + i, max_tokens=24) for i in range(len(prompts))]
    alone = _serve(_specs(tiny_pair), RStitch(tau=TINY_PAIR_TAU), prompts, free)
    mixed_prompts = [p for p in prompts for _ in (0, 1)]
    mixed_params = [q for p in free for q in (p, _sampled(Pet, 1)[0])]
    mixed = _serve(_specs(tiny_pair), RStitch(tau=TINY_PAIR_TAU), mixed_prompts, mixed_params)
    for a, b in zip(alone, mixed[::2]):
        assert (a.token_ids, a.token_models) == (b.token_ids, b.token_models)
    for c in mixed[1::2]:
        Pet.model_validate_json(c.text)


@pytest.fixture(scope="module")
def drafting_pair(tiny_pair, tmp_path_factory):
    from tokenrouter.testing import build_perturbed_copy

    root = tmp_path_factory.mktemp("drafting-structured")
    return {"small": build_perturbed_copy(tiny_pair["large"], root / "small", noise=0.01), "large": tiny_pair["large"]}


@pytest.mark.parametrize("k, lookup", [(2, False), (6, False), (4, True)])
def test_greedy_speculative_under_a_grammar_equals_the_target_alone(drafting_pair, k, lookup):
    """Drafts the grammar refuses are rejected, accepted ones advance the verifier's matcher and
    rolled-back ones rewind the drafter's: the output is the constrained target's alone. So too
    with prompt-lookup drafts, which the verifier proposes to itself (JSON repeats its keys'
    punctuation)."""
    prompts = [f"Item {i}: describe it in JSON." for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=120, response_format=fmt) for fmt in (Pet, Tags) * 4]
    target = _serve({"large": ModelSpec(path=drafting_pair["large"])}, Single("large"), prompts, params)
    spec = _serve(_specs(drafting_pair), Speculative(k=k, lookup=lookup), prompts, params)
    for t, s in zip(target, spec):
        assert s.token_ids == t.token_ids
        assert s.finish_reason == t.finish_reason == "stop"
    assert any("small" in s.token_models for s in spec), "some drafts were accepted"


@pytest.mark.parametrize(
    "fmt, fragment",
    [
        ({"type": "nonsense"}, 'Unsupported type "nonsense"'),
        (Regex(pattern="(ab"), "parenthesis is not closed"),
        (Grammar(ebnf="root ::= foo"), 'Rule "foo" is not defined'),
        (Grammar(ebnf='start ::= "a"'), "root"),
    ],
    ids=["schema", "regex", "ebnf", "no-root"],
)
def test_an_invalid_constraint_fails_its_request_before_anything_runs(tiny_model, fmt, fragment):
    async def main():
        async with Engine(models={"m": tiny_model}) as e:
            with pytest.raises(InvalidRequestError) as info:
                await e.generate("hi", SamplingParams(max_tokens=4, response_format=fmt))
            assert info.value.field == "response_format" and fragment in str(info.value), str(info.value)
            assert e.stats()["m"].steps == 0  # nothing reached the worker
            ok = await e.generate("hi", SamplingParams(max_tokens=4, temperature=0))
            assert ok.finish_reason == "length"

    anyio.run(main)


def test_response_format_shapes():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert SamplingParams(response_format=schema).response_format == JsonSchema(json_schema=schema)
    assert SamplingParams(response_format={"type": "json_object"}).response_format == JsonSchema()
    openai = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert SamplingParams(response_format=openai).response_format == JsonSchema(json_schema=schema)
    assert SamplingParams(response_format=Pet).response_format.json_schema["title"] == "Pet"


def test_a_finished_grammar_ends_the_answer(tiny_pair):
    """A finished grammar allows only EOS: the answer is exactly the JSON, nothing after it."""
    params = SamplingParams(temperature=0, max_tokens=200, response_format=JsonSchema(json_schema=POINTS_SCHEMA))
    out = _serve(_specs(tiny_pair), RStitch(tau=TINY_PAIR_TAU), ["Points:"], [params])[0]
    assert out.finish_reason == "stop" and out.text.endswith("}")
    Points.model_validate_json(out.text)
