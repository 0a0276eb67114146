"""Bad input to SamplingParams, table-driven: every field at and beyond its limits, wrong types,
NaN and infinities (tests/bad_input.py says what the tables pin down)."""

from __future__ import annotations

import pydantic
import pytest

from tests.bad_input import INF, NAN, check_validation_error, ids, show
from tokenrouter import (
    SamplingParams,
)
from tokenrouter.config import Grammar, JsonSchema, Regex

# ---- SamplingParams ----------------------------------------------------------------------------
SP_INT = ["max_tokens", "top_k", "seed", "n", "logprobs", "prompt_logprobs"]
SP_FLOAT = ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]
SP_BOOL = ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens"]
SP_LIST = ["stop", "stop_token_ids"]
SP_OTHER = ["response_format"]  # dict and model-class shapes: tests/structured/test_structured_output.py

SP_ACCEPTED = [
    ("max_tokens", 1),
    ("max_tokens", 10**9),
    ("max_tokens", None),  # the room the prompt leaves
    ("temperature", 0),  # an int is a fine float
    ("temperature", 0.0),
    ("temperature", 100.0),
    ("top_k", 0),
    ("top_k", 10**6),
    ("top_p", 1),
    ("top_p", 1e-9),
    ("min_p", 0.0),
    ("min_p", 1.0),
    ("seed", 0),
    ("seed", 2**63 - 1),
    ("seed", None),
    ("stop", []),
    ("stop", "one string"),
    ("stop", ("a", "b")),
    ("stop", ["\n", "\x1b[0m", "\t"]),
    ("stop_token_ids", []),
    ("stop_token_ids", [0, 10**6]),  # the vocabulary bound is checked per request, against the model
    ("ignore_eos", True),
    ("include_stop_str_in_output", True),
    ("skip_special_tokens", False),
    ("n", 1),
    ("n", 128),
    ("response_format", None),
    ("response_format", JsonSchema(json_schema={"type": "object"})),
    ("response_format", JsonSchema()),
    ("response_format", Regex(pattern="[ab]+")),
    ("response_format", Grammar(ebnf='root ::= "x"')),
    ("repetition_penalty", 1),
    ("repetition_penalty", 1e-9),
    ("repetition_penalty", 0.5),
    ("repetition_penalty", 1e6),
    ("presence_penalty", -2),
    ("presence_penalty", 2.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", -2.0),
    ("frequency_penalty", 2),
    ("logprobs", None),
    ("logprobs", 0),
    ("logprobs", 20),
    ("prompt_logprobs", None),
    ("prompt_logprobs", 0),
    ("prompt_logprobs", 20),
]

SP_REJECTED = (
    [
        # limits
        ("max_tokens", 0, "greater than or equal to 1"),
        ("max_tokens", -1, "greater than or equal to 1"),
        ("temperature", -0.1, "greater than or equal to 0"),
        ("temperature", -1e-300, "greater than or equal to 0"),
        ("temperature", 100.001, "less than or equal to 100"),
        ("temperature", 1e308, "less than or equal to 100"),
        ("top_k", -1, "greater than or equal to 0"),
        ("top_p", 0, "greater than 0"),
        ("top_p", -0.5, "greater than 0"),
        ("top_p", 1.0000001, "less than or equal to 1"),
        ("min_p", -0.01, "greater than or equal to 0"),
        ("min_p", 1.01, "less than or equal to 1"),
        ("seed", -1, "greater than or equal to 0"),
        ("seed", 2**63, "less than 9223372036854775808"),
        ("seed", 2**64, "less than 9223372036854775808"),
        ("repetition_penalty", 0, "greater than 0"),
        ("repetition_penalty", -1.0, "greater than 0"),
        ("repetition_penalty", -1e-300, "greater than 0"),
        ("presence_penalty", -2.001, "greater than or equal to -2"),
        ("presence_penalty", 2.001, "less than or equal to 2"),
        ("presence_penalty", 1e308, "less than or equal to 2"),
        ("frequency_penalty", -3, "greater than or equal to -2"),
        ("frequency_penalty", 2.5, "less than or equal to 2"),
        ("logprobs", -1, "greater than or equal to 0"),
        ("logprobs", 21, "less than or equal to 20"),
        ("logprobs", 10**6, "less than or equal to 20"),
        ("prompt_logprobs", -1, "greater than or equal to 0"),
        ("prompt_logprobs", 21, "less than or equal to 20"),
        # stop strings
        ("stop", "", "non-empty"),
        ("stop", ["ok", ""], "non-empty"),
        ("stop", [5], "valid string"),
        ("stop", [None], "valid string"),
        ("stop", [["a"]], "valid string"),
        ("stop", ["bad \ud800"], "lone surrogate"),
        ("stop", None, "valid list"),
        ("stop", 5, "valid list"),
        # stop token ids
        ("stop_token_ids", [-1], "greater than or equal to 0"),
        ("stop_token_ids", [1, -5], "greater than or equal to 0"),
        ("stop_token_ids", ["1"], "valid integer"),
        ("stop_token_ids", [1.0], "valid integer"),
        ("stop_token_ids", [True], "valid integer"),
        ("stop_token_ids", [None], "valid integer"),
        ("stop_token_ids", None, "valid list"),
        ("stop_token_ids", 7, "valid list"),
        ("stop_token_ids", "1,2", "valid list"),
        # samples
        ("n", 0, "greater than or equal to 1"),
        ("n", 129, "less than or equal to 128"),
        # response formats (a schema that does not compile fails at submission: test_structured_output.py)
        ("response_format", 5, "must be a JSON Schema dict"),
        ("response_format", "{}", "must be a JSON Schema dict"),
        ("response_format", int, "must be a JSON Schema dict"),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": 3}}, "json_schema.schema"),
        # unknown field
        ("bogus", 1, "Extra inputs are not permitted"),
        ("maxtokens", 16, "Extra inputs are not permitted"),
    ]
    + [(f, v, "valid integer") for f in SP_INT for v in (True, False, "3", 3.0, [3], 1e3)]
    + [(f, None, "valid integer") for f in SP_INT if f not in ("seed", "logprobs", "prompt_logprobs", "max_tokens")]
    + [(f, v, "finite number") for f in SP_FLOAT for v in (NAN, INF, -INF)]
    + [(f, v, "valid number") for f in SP_FLOAT for v in (True, False, "0.5", [0.5], None)]
    + [(f, v, "valid boolean") for f in SP_BOOL for v in (1, 0, "yes", "true", None, [True])]
)


def test_sampling_params_tables_cover_every_field():
    fields = set(SamplingParams.model_fields)
    assert set(SP_INT + SP_FLOAT + SP_BOOL + SP_LIST + SP_OTHER) == fields
    assert {f for f, *_ in SP_REJECTED} >= fields
    assert {f for f, _ in SP_ACCEPTED} == fields


@pytest.mark.parametrize("field, value", ids(SP_ACCEPTED, lambda r: f"{r[0]}={show(r[1])}"))
def test_sampling_params_accept_values_at_the_limits(field, value):
    p = SamplingParams(**{field: value})
    got = getattr(p, field)
    if field == "stop":
        assert got == ([value] if isinstance(value, str) else list(value))
    else:
        assert got == value and type(got) is type(value if field not in SP_FLOAT else 0.0)


@pytest.mark.parametrize("field, value, fragment", ids(SP_REJECTED, lambda r: f"{r[0]}={show(r[1])}"))
def test_sampling_params_reject_bad_values(field, value, fragment):
    with pytest.raises(pydantic.ValidationError) as e:
        SamplingParams(**{field: value})
    check_validation_error(e.value, field, fragment)
