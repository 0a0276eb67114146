"""What the single-model benchmark (bench_single.py) asks of every system: the same chat-formatted prompts
(token ids, built once and deterministically from --seed), the same output length per request, and warm-up
prompts of their own, so that no prefix cache ever holds a measured prompt."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from benchmarks.bench_log import log

# Deterministic prompt material: an instruction plus filler words, lengthened to a target token count.
_INSTRUCTIONS = [
    "Explain in simple terms how {a} relates to {b}.",
    "Write a short story about {a} and {b}.",
    "Give me a list of tips about {a}, keeping {b} in mind.",
    "Summarize the following notes on {a}:",
    "What are the pros and cons of {a} compared with {b}?",
    "Translate these thoughts about {a} into plain English:",
    "Write a poem that mentions {a}, {b} and the sea.",
    "Describe a day in the life of someone who studies {a}.",
]
_WORDS = [
    "river",
    "mountain",
    "engine",
    "garden",
    "library",
    "coffee",
    "window",
    "planet",
    "signal",
    "market",
    "winter",
    "orange",
    "theory",
    "bridge",
    "forest",
    "music",
    "number",
    "kitchen",
    "ocean",
    "silver",
    "travel",
    "camera",
    "history",
    "language",
    "pencil",
    "harbor",
    "storm",
    "network",
    "sunlight",
    "school",
    "bicycle",
    "castle",
    "memory",
    "paper",
    "energy",
    "island",
    "doctor",
    "village",
    "science",
    "morning",
    "dragon",
    "letter",
    "season",
    "battery",
    "cloud",
    "desert",
    "violin",
    "museum",
    "recipe",
    "rocket",
    "shadow",
    "teacher",
    "garden",
    "puzzle",
    "lantern",
    "canyon",
    "festival",
    "compass",
    "meadow",
    "circuit",
    "glacier",
    "orchard",
    "telescope",
]


def build_prompts(tokenizer, n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """n chat-formatted prompts (token ids, with the generation prompt), lengths about uniform in [lo, hi]."""
    from tokenrouter.api import chat_ids

    rng = random.Random(seed)
    prompts = []

    def encode(text: str) -> list[int]:
        return chat_ids(tokenizer, [{"role": "user", "content": text}])

    for _ in range(n):
        target = rng.randint(lo, hi)
        a, b = rng.sample(_WORDS, 2)
        text = rng.choice(_INSTRUCTIONS).format(a=a, b=b)
        ids = encode(text)
        # add words in chunks while far from the target, then one at a time
        while len(ids) < target:
            missing = target - len(ids)
            k = max(1, missing // 2)
            text += " " + " ".join(rng.choice(_WORDS) for _ in range(k))
            ids = encode(text)
        prompts.append(ids)
    return prompts


def prompts_per_run(num_prompts: int | None, c: int) -> int:
    """The prompts of a run at concurrency `c`: --num-prompts, or max(8, 2 x C)."""
    return num_prompts or max(8, 2 * c)


@dataclass
class Workload:
    """The prompts of every measured run (a run at concurrency C takes the first `num_prompts(C)`), each
    request's output length, the warm-up prompts, and the tokenizer's padding id (static batches pad with it)."""

    prompts: list[list[int]]
    lengths: list[int]
    warm_prompts: list[list[int]]
    pad_id: int
    fixed_num_prompts: int | None = None  # --num-prompts; unset: max(8, 2 x C)

    def num_prompts(self, c: int) -> int:
        return prompts_per_run(self.fixed_num_prompts, c)

    @property
    def prompt_lengths(self) -> list[int]:
        return [len(x) for x in self.prompts]


def make_workload(args, tok) -> Workload:
    """The workload of `args` (bench_single.py's options), its prompts encoded by `tok`."""
    n_max = max(prompts_per_run(args.num_prompts, c) for c in args.concurrency)
    prompts = build_prompts(tok, n_max, args.min_prompt_tokens, args.max_prompt_tokens, args.seed)
    rng = random.Random(args.seed + 1)
    lengths = [
        args.max_tokens
        if args.output_lengths == "fixed"
        else rng.randint(max(1, args.max_tokens // 4), args.max_tokens)
        for _ in prompts
    ]
    warm_prompts = build_prompts(
        tok,
        max(args.warmup_prompts, max(args.concurrency)),
        args.min_prompt_tokens,
        args.max_prompt_tokens,
        args.seed + 7919,
    )  # distinct from the measured prompts, so no prefix cache ever holds a measured prompt
    plens = [len(x) for x in prompts]
    log(
        f"{len(prompts)} prompts, {min(plens)}-{max(plens)} tokens (mean {statistics.fmean(plens):.0f}); "
        f"{args.output_lengths} output lengths up to {args.max_tokens} (mean {statistics.fmean(lengths):.0f})"
    )
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return Workload(prompts, lengths, warm_prompts, pad_id, args.num_prompts)
