"""The one rule that ends a request on a token, which decoding and verification both apply."""

from tokenrouter.config import SamplingParams
from tokenrouter.engine.sequence import Request
from tokenrouter.engine.stop_rule import StopRule


def _request(ignore_eos: bool = False, max_tokens: int = 5) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    return Request("r", [1, 2], params, seed=0, stop_token_ids=frozenset({7}), max_tokens=max_tokens)


def test_eos_a_stop_token_and_max_tokens_end_a_request_in_that_order():
    rule = StopRule(frozenset({0}))
    assert rule.finish_reason(_request(), 0, 1) == "stop"
    assert rule.finish_reason(_request(), 7, 1) == "stop"
    assert rule.finish_reason(_request(), 0, 5) == "stop"  # an EOS as the last allowed token is a stop
    assert rule.finish_reason(_request(), 3, 5) == "length"
    assert rule.finish_reason(_request(), 3, 4) is None


def test_ignore_eos_ignores_the_models_eos_but_not_the_requests_stop_tokens():
    rule = StopRule(frozenset({0}))
    assert rule.finish_reason(_request(ignore_eos=True), 0, 1) is None
    assert rule.finish_reason(_request(ignore_eos=True), 7, 1) == "stop"
    assert rule.finish_reason(_request(ignore_eos=True), 0, 5) == "length"
