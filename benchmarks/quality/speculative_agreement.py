#!/usr/bin/env python
"""The demo pair's greedy agreement on bench_routing.TASKS, and what it lets speculative decoding
gain: the large model (Hugging Face, float32) writes its own greedy answer to each task, the
small model reads that answer teacher-forced, and its argmax at each position says whether a
draft there would be accepted. An accepted draft equals the large model's token, so this decides
every draft exactly: the tokens per draft-and-verify cycle a greedy Speculative(k) must get
follow for each k, with no engine involved (bench_speculative.py measures the engine's).

    python benchmarks/quality/speculative_agreement.py --out benchmarks/results/speculative/agreement.jsonl
    python benchmarks/quality/speculative_agreement.py --int8 --out benchmarks/results/speculative-int8/agreement.jsonl

`--int8` also scores a copy of the small model with its linear layers in int8, as
`ModelSpec(quantization="int8")` loads it (engine/quant/int8.py), on the same answers. The store
keeps GGUF files; transformers loads their dense copy (`dense_checkpoint`, written once).
`--small DIR --large DIR` takes another pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS
from tokenrouter.api import chat_ids
from tokenrouter.engine import dense_checkpoint
from tokenrouter.store import ensure_model


def cycles(agree: list[int], k: int) -> tuple[int, int]:
    """(cycles, accepted drafts) of greedy speculative decoding with k drafts over an answer whose
    position j the drafter gets right when agree[j]: each cycle keeps the drafts up to the first
    miss, then the target writes one token itself."""
    p = n = accepted = 0
    while p < len(agree):
        j = 0
        while j < k and p + j < len(agree) and agree[p + j]:
            j += 1
        n, accepted, p = n + 1, accepted + j, p + j + 1
    return n, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=len(TASKS), help="the first N tasks (default all 16)")
    ap.add_argument("--max-tokens", type=int, default=48, help="answer length, as bench_speculative.py")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--int8", action="store_true", help="also the small model in int8 (ModelSpec quantization)")
    ap.add_argument("--out", default=None, help="JSON lines, one per task")
    ap.add_argument("--small", help="the drafter's directory (default: the store's qwen-coder-0.5b)")
    ap.add_argument("--large", help="the target's directory (default: the store's qwen-coder-1.5b)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    large_path = str(dense_checkpoint(args.large or ensure_model("qwen-coder-1.5b")))
    small_path = str(dense_checkpoint(args.small or ensure_model("qwen-coder-0.5b")))
    tok = AutoTokenizer.from_pretrained(large_path)
    large = AutoModelForCausalLM.from_pretrained(large_path, dtype=torch.float32).eval()
    small = AutoModelForCausalLM.from_pretrained(small_path, dtype=torch.float32).eval()
    drafters = {"": small}
    if args.int8:
        from tokenrouter.engine.quant.int8 import quantize_linears

        drafters["int8_"] = AutoModelForCausalLM.from_pretrained(small_path, dtype=torch.float32).eval()
        quantize_linears(drafters["int8_"])
    n = args.max_tokens
    out = open(args.out, "w") if args.out else None
    rows = []
    with torch.no_grad():
        for i, task in enumerate(TASKS[: args.tasks]):
            prompt = chat_ids(tok, [{"role": "user", "content": task}])
            answer = large.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
            y = answer[0, len(prompt) :].tolist()
            row = {"task": i}
            for prefix, drafter in drafters.items():
                guess = drafter(torch.tensor([prompt + y])).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
                agree = [int(a == b) for a, b in zip(guess, y)]
                row[f"{prefix}agree"], row[f"{prefix}agree_bits"] = sum(agree) / len(y), "".join(map(str, agree))
                for k in (1, 2, 3, 4):
                    c, acc = cycles(agree, k)
                    row[f"{prefix}k{k}"] = {"cycles": c, "accepted": acc, "tokens_per_cycle": len(y) / c}
            rows.append(row)
            print(json.dumps(row), file=out or None, flush=True)
    for prefix in drafters:
        name = prefix.rstrip("_") or "float32"
        print(
            f"{name}: agreement, mean over {len(rows)} tasks: {sum(r[f'{prefix}agree'] for r in rows) / len(rows):.3f}"
        )
        for k in (1, 2, 3, 4):
            print(f"  k = {k}: {len(rows) * n / sum(r[f'{prefix}k{k}']['cycles'] for r in rows):.2f} tokens per cycle")


if __name__ == "__main__":
    main()
