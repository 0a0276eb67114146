#!/usr/bin/env python
"""Prompt-lookup drafts on the agentic-edit workload: Speculative(lookup=True) through the engine,
beside llama-cpp-python's own `LlamaPromptLookupDecoding`, on the demo pair at C = 1.

Every request is a turn of `tokenrouter bench`'s agentic-edit sessions (a file of this package's
own code quoted with a grep of it, "reply with the whole edited file", then the file again with a
comment added): greedy, exactly --max-tokens tokens per turn (EOS ignored), each next turn
carrying the previous answer. Per round (rounds interleave, so a drift of the machine hits one
repeat of each system; each round draws its own sessions, the same for every system in it):

  llama.cpp large            `llama_cpp.Llama` on the store's Q4_K_M GGUF of the large model, in
                             its own thread (bench_cpu_anchor.in_own_thread says why), one turn
                             after another
  llama.cpp large+lookup     the same with draft_model=LlamaPromptLookupDecoding(num_pred_tokens=
                             --lookup-tokens) (its default max_ngram_size=2)
  engine large               the large model alone (Single), through tokenrouter.bench
  engine speculative-4       Speculative(k=4): the 0.5B drafts, the 1.5B verifies
  engine lookup-4            Speculative(k=4, lookup=PromptLookup(tokens=--lookup-tokens)):
                             lookup drafts where the text repeats, the 0.5B elsewhere
  engine lookup-auto         the same with k="auto"

Speculative is lossless, so each engine system's greedy tokens are checked against the engine's
large model alone, turn by turn, and the check is recorded (`same_tokens_as_large`). Tables show
medians over --repeats rounds; the raw runs go to --json.

    python benchmarks/engine/bench_prompt_lookup.py                                  # the measurement
    python benchmarks/engine/bench_prompt_lookup.py --repeats 1 --max-tokens 16 --json /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.anchors.bench_cpu_anchor import MODELS, PRECISION_OPTIONS, THREADS, in_own_thread, pin_cores
from tokenrouter import store
from tokenrouter.api import chat_ids
from tokenrouter.bench import BenchConfig, machine_info, release_memory, run_bench, workload
from tokenrouter.config import ModelSpec
from tokenrouter.engine import load_tokenizer
from tokenrouter.eval.results import portable
from tokenrouter.policies import PromptLookup, Speculative

CONCURRENCY = 1
WORKLOAD = "agentic-edit"
OUT = Path(__file__).resolve().parents[1] / "results" / "prompt-lookup" / "prompt-lookup.json"


def engine_policies(lookup_tokens: int) -> dict:
    lookup = PromptLookup(tokens=lookup_tokens)
    return {
        "speculative-4": Speculative(k=4),
        "lookup-4": Speculative(k=4, lookup=lookup),
        "lookup-auto": Speculative(k="auto", lookup=lookup),
    }


def llama_sessions(llm, tokenizer, sessions) -> dict:
    """Every session's turns in sequence, greedy, exactly max_tokens each (the next turn carries
    the answer's text, as tokenrouter.bench does): output tok/s and per-turn latencies."""
    latencies, tokens, t0 = [], 0, time.perf_counter()
    for s in sessions:
        messages = list(s.messages)
        for t, max_tokens in enumerate(s.max_tokens):
            t_turn, out = time.perf_counter(), []
            for token in llm.generate(chat_ids(tokenizer, messages), temp=0.0, top_k=1, reset=True):
                out.append(token)
                if len(out) == max_tokens:
                    break
            latencies.append(time.perf_counter() - t_turn)
            tokens += len(out)
            if t + 1 < s.turns:
                answer = tokenizer.decode(out, skip_special_tokens=True).replace("\x00", "")
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": s.followups[t]}]
    wall = time.perf_counter() - t0
    return {"tok_per_s": tokens / wall, "wall_s": wall, "output_tokens": tokens, "latencies_s": latencies}


def llama_round(gguf: Path, tokenizer, sessions, lookup_tokens: int | None, n_ctx: int) -> dict:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
    # A draft model needs every position's logits; llama-cpp-python 0.3.36 then keeps them, but
    # sizes their buffer by the logits_all it is given (n_batch rows), so a longer prompt fails
    # to fit unless logits_all=True is given too.
    llm = Llama(
        model_path=str(gguf),
        n_threads=THREADS,
        n_ctx=n_ctx,
        verbose=False,
        seed=0,
        draft_model=draft,
        logits_all=draft is not None,
    )
    for n, _ in enumerate(llm.generate(chat_ids(tokenizer, sessions[0].messages)[:32], temp=0.0, top_k=1, reset=True)):
        if n == 7:  # a warm-up of 8 tokens
            break
    return llama_sessions(llm, tokenizer, sessions)


def engine_round(args, paths, spec, round_no: int, say) -> list[dict]:
    dtype, fields = PRECISION_OPTIONS[args.precision]
    policies = engine_policies(args.lookup_tokens)
    systems = ["large", *policies]
    cfg = BenchConfig(
        models=paths,
        policy=policies["speculative-4"],
        other_policies=policies,
        systems=[s for s in systems if not args.systems or s in args.systems],
        workloads=[spec],
        concurrency=[CONCURRENCY],
        repeats=1,
        requests=args.sessions,
        kv_cache_tokens=args.kv_cache_tokens,
        reuse_engines=True,
        seed=round_no,  # the same sessions as llama.cpp's this round
        dtype=dtype,
        model_options={m: dict(fields) for m in paths},
    )
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    result = anyio.run(lambda: run_bench(cfg, tokenizer, progress=say))
    alone = next((r.outputs() for r in result.runs if r.system == "large"), None)
    out = []
    for run in result.runs:
        m = run.metrics()
        record = {
            "system": run.system,
            "round": round_no,
            **{k: m[k] for k in ("tok_per_s", "wall_s", "output_tokens", "p50_s", "tokens_by_model", "handoffs")},
            "steps": run.steps,
            "proposed_tokens": run.proposed_tokens.get("large", 0),
            "proposed_accepted": run.proposed_accepted.get("large", 0),
        }
        if alone is not None and run.system != "large":
            ours = run.outputs()
            common = sorted(set(alone) & set(ours))
            record["turns_compared"] = len(common)
            record["turns_differing"] = sum(alone[k] != ours[k] for k in common)
            record["same_tokens_as_large"] = bool(common) and record["turns_differing"] == 0
        out.append(record)
    out.append({"round": round_no, "bench": {k: v for k, v in result.to_dict().items() if k != "runs"}})
    return out


def table(records: list[dict], llama: list[dict]) -> str:
    """Medians of tok/s per system, their ratios, and each engine system's token check and lookups."""
    runs = [(f"llama.cpp {r['system']}", r) for r in llama] + [
        (f"engine {r['system']}", r) for r in records if "system" in r
    ]
    by_name: dict[str, list[dict]] = {}
    for name, r in runs:
        by_name.setdefault(name, []).append(r)
    med = {name: statistics.median(r["tok_per_s"] for r in rs) for name, rs in by_name.items()}
    anchor, alone = med.get("llama.cpp large"), med.get("engine large")
    lines = [
        f"| system (C={CONCURRENCY}) | tok/s | x llama.cpp large | x engine large | same tokens as engine large "
        "| lookup tokens accepted / proposed |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, rs in by_name.items():
        v = med[name]
        checks = [r["same_tokens_as_large"] for r in rs if "same_tokens_as_large" in r]
        proposed, accepted = (
            sum(r.get("proposed_tokens", 0) for r in rs),
            sum(r.get("proposed_accepted", 0) for r in rs),
        )
        cells = [
            name,
            f"{v:.1f}",
            f"{v / anchor:.2f}" if anchor else "",
            f"{v / alone:.2f}" if alone and name.startswith("engine") else "",
            ("yes" if all(checks) else "NO") if checks else "",
            f"{accepted} / {proposed}" if proposed else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> None:
    paths = {m: str(store.ensure_model(name)) for m, name in MODELS.items()}
    gguf = store.gguf_for(paths["large"])
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    spec = workload(WORKLOAD, args.size, max_tokens=args.max_tokens, history_tokens=args.history_tokens)
    command = shlex.join(["python", *sys.argv])
    print(f"# {command}", flush=True)
    records: list[dict] = []
    llama: list[dict] = []
    for r in range(args.repeats):
        sessions = spec.build(tokenizer, args.sessions, seed=r, level=CONCURRENCY)  # what run_bench builds
        n_ctx = max(2048, max(s.context_tokens() for s in sessions) + 64)
        for name, lookup in (("large", None), ("large+lookup", args.lookup_tokens)):
            if args.systems and f"llama-{name}" not in args.systems:
                continue
            res = in_own_thread(lambda lookup=lookup: llama_round(gguf, tokenizer, sessions, lookup, n_ctx))
            llama.append({"system": name, "round": r, **res})
            print(f"round {r + 1}: llama.cpp {name}: {res['tok_per_s']:.1f} tok/s", flush=True)
            release_memory()
        records += engine_round(args, paths, spec, r, lambda line: print(f"round {r + 1}: {line}", flush=True))
        text = table(records, llama)
        print(text, flush=True)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            portable(
                json.dumps(
                    {
                        "command": command,
                        "machine": machine_info(),
                        "models": {m: {"store": MODELS[m]} for m in MODELS} | {"large_gguf": gguf.name},
                        "workload": {"name": WORKLOAD, "description": spec.describe(), "sizes": spec.sizes_dict()},
                        "precision": args.precision,
                        "policies": {k: repr(p) for k, p in engine_policies(args.lookup_tokens).items()},
                        "llama_cpp_lookup": f"LlamaPromptLookupDecoding(num_pred_tokens={args.lookup_tokens})",
                        "rounds_done": r + 1,
                        "llama_cpp": llama,
                        "engine": records,
                        "table": text,
                    },
                    indent=1,
                )
            )
            + "\n"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="gguf+bf16", choices=list(PRECISION_OPTIONS), help="the engine's")
    p.add_argument("--size", default="cpu", choices=["cpu", "gpu", "tiny"], help="agentic-edit's sizes")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens every turn writes (default: the size's)")
    p.add_argument("--history-tokens", type=int, default=None, help="the quoted file's tokens (default: the size's)")
    p.add_argument("--sessions", type=int, default=4, help="sessions per round")
    p.add_argument("--lookup-tokens", type=int, default=10, help="tokens one lookup proposes (both engines)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument(
        "--systems",
        nargs="+",
        help="only these: llama-large, llama-large+lookup, large, speculative-4, lookup-4, lookup-auto",
    )
    p.add_argument("--json", default=str(OUT), help="every run, the medians and the machine (after each round)")
    a = p.parse_args()
    pin_cores()
    main(a)
