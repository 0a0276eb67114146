#!/usr/bin/env python
"""Does the engine's OpenMP team spin between parallel regions? Each thread's voluntary context
switches and CPU time (from /proc) over one request, on the demo pair or the 1.5B alone.

GNU OpenMP keeps a team for every thread that has run a parallel region, and once a process's
OpenMP threads outnumber its cores it stops spinning between regions: each region's threads
then sleep and wake, a few hundred times a decode step. A thread that computes and switches a
handful of times a request spins; hundreds of switches a step is the other case.

    python benchmarks/kernels/openmp_threads.py --system speculative-4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

from tokenrouter import Engine, SamplingParams
from tokenrouter.bench import machine_info
from tokenrouter.policies import Single, Speculative

SYSTEMS = {"speculative-4": lambda: Speculative(k=4), "large": lambda: Single("large")}


def threads_now() -> dict[int, dict]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/self/task/{tid}/status") as f:
            switches = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        out[int(tid)] = {"cpu_ticks": int(fields[11]) + int(fields[12]), "voluntary_switches": switches}
    return out


async def run(system: str, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    async with Engine(policy=SYSTEMS[system]()) as e:
        await e.generate("Write a Python function that checks whether a number is prime.", params)
        before, steps0 = threads_now(), {m: s.steps for m, s in e.stats().items()}
        t = time.perf_counter()
        await e.generate("Write a Python function that reverses a string.", params)
        wall = time.perf_counter() - t
        after, steps = threads_now(), {m: s.steps - steps0[m] for m, s in e.stats().items()}
        names = {t.native_id: t.name for t in threading.enumerate()}
    rows = []
    for tid in sorted(after):
        was = before.get(tid, {"cpu_ticks": 0, "voluntary_switches": 0})
        rows.append(
            {
                "thread": names.get(tid, "(not Python's: OpenMP, tokenizers, ...)"),
                "cpu_ticks": after[tid]["cpu_ticks"] - was["cpu_ticks"],
                "voluntary_switches": after[tid]["voluntary_switches"] - was["voluntary_switches"],
            }
        )
    return {"system": system, "wall_s": wall, "steps": steps, "threads": rows, "machine": machine_info()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=sorted(SYSTEMS), default="speculative-4")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args()
    result = anyio.run(run, args.system, args.max_tokens)
    print(f"{args.system}: {result['wall_s']:.2f} s, steps {result['steps']}")
    for r in result["threads"]:
        print(f"  {r['thread']:44s} cpu ticks {r['cpu_ticks']:5d}  voluntary switches {r['voluntary_switches']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
