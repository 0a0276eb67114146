"""A finished request as OpenAI's `ChatCompletion`, with the routing record as an extension field.

`"tokenrouter"` holds who wrote what (`tokens_per_model`), how often the request moved
(`num_handoffs`) and what each model's forwards took in (`tokens_processed`), summed over the
choices; each logprob entry names its token's writer (`"model"`). OpenAI's clients keep unknown
fields, so `completion.tokenrouter` reads it back.
"""

from __future__ import annotations

import json
import time

from ..outputs import RequestOutput, ToolCall
from .logprobs import LogprobFormatter
from .request import ChatRequest


def samples(out: RequestOutput) -> list[RequestOutput]:
    """Every sample of a request: `completions` with n > 1, else the output itself."""
    return out.completions or [out]


def finish_reason(out: RequestOutput) -> str:
    """OpenAI's reason: "tool_calls" where the answer holds calls, else the engine's ("stop", "length")."""
    return "tool_calls" if out.tool_calls else out.finish_reason


def tool_call(call: ToolCall, index: int | None = None) -> dict:
    """A call as OpenAI sends it: `arguments` a JSON string. A stream's calls carry their `index`."""
    function = {"name": call.name, "arguments": json.dumps(call.arguments)}
    entry = {"id": call.id, "type": "function", "function": function}
    return entry if index is None else {"index": index, **entry}


def routing_record(outs: list[RequestOutput]) -> dict:
    per_model: dict[str, int] = {}
    processed: dict[str, int] = {}
    for out in outs:
        for model, n in out.tokens_per_model().items():
            per_model[model] = per_model.get(model, 0) + n
        for model, n in out.tokens_processed.items():
            processed[model] = processed.get(model, 0) + n
    return {
        "tokens_per_model": per_model,
        "num_handoffs": sum(out.num_handoffs for out in outs),
        "tokens_processed": processed,
    }


def usage(outs: list[RequestOutput]) -> dict:
    """The prompt counted once (the samples share it), the completions summed."""
    prompt = len(outs[0].prompt_token_ids)
    completion = sum(len(out.token_ids) for out in outs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": outs[0].num_cached_prompt_tokens},
    }


def completion(
    request_id: str, created: int, req: ChatRequest, out: RequestOutput, logprobs: LogprobFormatter | None
) -> dict:
    """The `ChatCompletion` dict for a finished request (every sample a choice)."""
    outs = samples(out)
    choices = []
    for i, sample in enumerate(outs):
        message: dict = {"role": "assistant", "content": sample.message()["content"], "refusal": None}
        if sample.tool_calls:
            message["content"] = message["content"] or None
            message["tool_calls"] = [tool_call(c) for c in sample.tool_calls]
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": None
                if logprobs is None
                else {"content": logprobs.content(sample.logprobs), "refusal": None},
                "finish_reason": finish_reason(sample),
            }
        )
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": req.model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage(outs),
        "tokenrouter": routing_record(outs),
    }


def now() -> int:
    return int(time.time())
