"""Logprobs in OpenAI's shape, each entry naming the model that wrote its token.

`token` is the token decoded alone (as vLLM gives it: a piece of a multi-byte character decodes
to U+FFFD); `bytes` are the token's own bytes, as OpenAI gives them, so that a client joining
them gets the text back whole. A byte-level BPE token (Qwen, Llama 3, GPT-2) maps back to its
bytes exactly; a SentencePiece byte token (`<0xE2>`) is its byte; any other token, its text's
UTF-8.
"""

from __future__ import annotations

import math
import re

from ..outputs import TokenLogprob

FLOOR = -9999.0  # JSON has no -inf; vLLM sends this instead
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's table from the printable characters a byte-level BPE writes back to the bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    kept, chars = printable + others, printable + [256 + i for i in range(len(others))]
    return {chr(c): b for b, c in zip(kept, chars)}


def _is_byte_level(tokenizer) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


class LogprobFormatter:
    """Token strings and bytes of one tokenizer, remembered per token id."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = _byte_level_decoder() if _is_byte_level(tokenizer) else None
        self.known: dict[int, tuple[str, list[int]]] = {}

    def token(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self.known:
            text = self.tokenizer.decode([token_id])
            piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
            byte = _BYTE_TOKEN.match(piece)
            if self.byte_level is not None and piece and all(c in self.byte_level for c in piece):
                raw = [self.byte_level[c] for c in piece]
            elif byte:
                raw = [int(byte.group(1), 16)]
            else:
                raw = list(text.encode("utf-8"))
            self.known[token_id] = (text, raw)
        return self.known[token_id]

    def entry(self, token_id: int, logprob: float) -> dict:
        text, raw = self.token(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": raw}

    def content(self, logprobs: list[TokenLogprob] | None) -> list[dict]:
        """`choices[i].logprobs.content`: per token, its entry, its alternatives and its writer."""
        out = []
        for lp in logprobs or []:
            entry = self.entry(lp.token_id, lp.logprob)
            entry["top_logprobs"] = [self.entry(t, v) for t, v in lp.top]
            entry["model"] = lp.model
            out.append(entry)
        return out


def _finite(x: float) -> float:
    return FLOOR if math.isinf(x) and x < 0 or math.isnan(x) else max(float(x), FLOOR)
