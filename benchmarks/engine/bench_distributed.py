#!/usr/bin/env python
"""Models in Ray actors against one process (issue 18): what the transport costs.

On a local Ray cluster of two simulated nodes (`ray.cluster_utils.Cluster`; the head offers
the custom resource "node_small", the other node "node_large"), each pair of models is served
two ways with the same settings, `num_threads=1` per worker:

  in_process   both workers in this process (two threads), as without a placement
  actors       each worker in a Ray actor pinned to its own node (RayPlacement(resources=...))

Both engines are started once and reused; before each run the prefix caches are emptied and the
prompts are new, so no run reads another's cache. Per pair and concurrency C: one warm-up run
per system, then `--repeats` rounds, the systems interleaved in each; a run is C requests at
once, greedy, `--max-tokens` each (EOS off). Reported: output tokens/s (medians over rounds;
every sample in the JSON), hand-offs, and per actor the share of its worker's time spent in
transport (`stats().time_transport_s`: sending a step's hand-offs and events, and applying the
envelopes that arrive) over its step time.

Also measured:
- round trips through the envelope path, actor to actor and caller to actor (the fleet's
  start-up pings, `Fleet.link_rtt_s`);
- the added latency per hand-off: a policy that hands off after every token (EveryK(1)), C = 1,
  `--max-tokens` tokens, (actors - in_process) seconds / hand-offs, median over rounds;
- how long after `ray.kill` of the large model's actor its requests end with an error.

`--ray-calls` turns the actors' direct channels off (`channel.py`): hand-offs and events then go
by Ray calls, as before the channels; the numbers the channels were measured against.

Pairs: "tiny" is the tests' float64 random pair (tests/conftest.py's tiny_pair, under
RStitch(tau=0.2)); "smollm2" is SmolLM2-135M-Instruct paired with itself (the store's copy,
`tokenrouter.store.ensure_model("smollm2")`, float32 on CPU) under RStitch(tau=--smollm2-tau).
The load average is recorded before and after every run (this machine's two cores are shared
with a background job at nice 19).

    python benchmarks/engine/bench_distributed.py --out benchmarks/results/distributed/distributed.json
    python benchmarks/engine/bench_distributed.py --pairs tiny --ray-calls --no-kill \
        --out benchmarks/results/distributed/ray_calls.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import anyio  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from tokenrouter import Engine, ModelSpec, RayPlacement, RStitch, SamplingParams  # noqa: E402
from tokenrouter.policies import Policy, Route, StepResult  # noqa: E402
from tokenrouter.testing import workers_of  # noqa: E402

NODES = {"small": {"node_small": 8}, "large": {"node_large": 8}}


class EveryToken(Policy):
    """Keep every token and hand the request to the other model after each one: every token is a hand-off."""

    @property
    def models(self):
        return ["small", "large"]

    def route(self, result: StepResult) -> Route:
        n = len(result)
        return Route(torch.ones(n, dtype=torch.bool), torch.full((n,), 1 - result.model_index, dtype=torch.long))


def channels_off(worker) -> None:
    """In an actor: send hand-offs and events by Ray calls only (as without the direct channels)."""
    from tokenrouter.distributed.links import PeerLink

    worker.queue.channel = None
    for peer in worker.peers.values():
        if isinstance(peer, PeerLink):
            peer.link.channel = None


def tiny_pair(root: Path) -> dict[str, Path]:
    from tokenrouter.testing import build_tiny_pair

    return build_tiny_pair(root)  # the tests' pair


def specs(paths: dict, placed: bool, dtype: str) -> dict[str, ModelSpec]:
    return {
        name: ModelSpec(
            path=path,
            dtype=dtype,
            kv_cache_tokens=8192,
            block_size=16,
            placement=RayPlacement(num_cpus=1, resources={next(iter(NODES[name])): 1}) if placed else None,
        )
        for name, path in paths.items()
    }


def prompts(n: int, vocab: int, seed: int, length: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def counters(engine: Engine) -> dict:
    return {n: (s.time_step_s, s.time_transport_s, s.steps, s.handoffs_sent) for n, s in engine.stats().items()}


async def one_run(engine: Engine, ps: list[list[int]], max_tokens: int) -> dict:
    await engine.reset_prefix_cache()
    before = counters(engine)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    outs = await engine.generate_batch(ps, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    wall = time.perf_counter() - t0
    after = counters(engine)
    tokens = sum(len(o.token_ids) for o in outs)
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs]
    share = {}
    for n in after:
        step, transport = after[n][0] - before[n][0], after[n][1] - before[n][1]
        share[n] = {
            "step_s": step,
            "transport_s": transport,
            "steps": after[n][2] - before[n][2],
            "transport_share": transport / step if step > 0 else 0.0,
        }
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "handoffs": sum(o.num_handoffs for o in outs),
        "small_share": sum(m == "small" for o in outs for m in o.token_models) / tokens,
        "workers": share,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "outputs": [o.token_ids for o in outs],
    }


def median(xs):
    return statistics.median(xs) if xs else None


async def bench_pair(name, paths, dtype, policy_of, concurrencies, repeats, max_tokens, vocab, ray_calls=False) -> dict:
    engines = {
        "in_process": Engine(models=specs(paths, False, dtype), policy=policy_of(), num_threads=1),
        "actors": Engine(models=specs(paths, True, dtype), policy=policy_of(), num_threads=1),
    }
    out = {"pair": name, "levels": {}}
    try:
        for system, e in engines.items():
            t0 = time.perf_counter()
            await e.start()
            out[f"start_s_{system}"] = time.perf_counter() - t0
        workers = workers_of(engines["actors"])
        out["link_rtt_s"] = {
            n: w.peer_rtt_s for n, w in workers.items()
        }  # measured at start, through the envelope path
        if ray_calls:
            import ray

            for w in workers.values():
                w.inspect(channels_off)
            out["link_rtt_s_ray_calls"] = {n: ray.get(w.handle.ping_peers.remote(20)) for n, w in workers.items()}
        out["handoff_delay_s"] = {n: w.handoff_delay_s for n, w in workers.items()}
        seed = 0
        for C in concurrencies:
            runs = {s: [] for s in engines}
            for system, e in engines.items():  # warm-up
                seed += 1
                await one_run(e, prompts(C, vocab, seed), max_tokens)
            for r in range(repeats):
                seed += 1
                ps = prompts(C, vocab, seed)
                results = {}
                for system, e in engines.items():  # interleaved, the same prompts
                    results[system] = await one_run(e, ps, max_tokens)
                same = results["in_process"]["outputs"] == results["actors"]["outputs"]
                for system, res in results.items():
                    res["same_tokens_as_in_process"] = same
                    res.pop("outputs")
                    runs[system].append(res)
                print(
                    f"{name} C={C} round {r}: "
                    + ", ".join(f"{s} {res['tokens_per_s']:.1f} tok/s" for s, res in results.items()),
                    flush=True,
                )
            level = {"runs": runs}
            for system in engines:
                level[system] = {
                    "tokens_per_s": median([x["tokens_per_s"] for x in runs[system]]),
                    "handoffs": median([x["handoffs"] for x in runs[system]]),
                    "transport_share": {
                        w: median([x["workers"][w]["transport_share"] for x in runs[system]]) for w in paths
                    },
                }
            level["actors_over_in_process"] = level["actors"]["tokens_per_s"] / level["in_process"]["tokens_per_s"]
            out["levels"][str(C)] = level
    finally:
        for e in engines.values():
            await e.close()
    return out


async def bench_handoff(paths, repeats, max_tokens, vocab, ray_calls=False) -> dict:
    """Every token a hand-off, C = 1: the added seconds per hand-off, actors over one process."""
    engines = {
        "in_process": Engine(models=specs(paths, False, "float64"), policy=EveryToken(), num_threads=1),
        "actors": Engine(models=specs(paths, True, "float64"), policy=EveryToken(), num_threads=1),
    }
    runs = {s: [] for s in engines}
    try:
        for e in engines.values():
            await e.start()
        if ray_calls:
            for w in workers_of(engines["actors"]).values():
                w.inspect(channels_off)
        for system, e in engines.items():
            await one_run(e, prompts(1, vocab, 1000), max_tokens)
        for r in range(repeats):
            ps = prompts(1, vocab, 1001 + r)
            for system, e in engines.items():
                res = await one_run(e, ps, max_tokens)
                res.pop("outputs")
                runs[system].append(res)
    finally:
        for e in engines.values():
            await e.close()
    added = [
        (a["wall_s"] - b["wall_s"]) / a["handoffs"] for a, b in zip(runs["actors"], runs["in_process"]) if a["handoffs"]
    ]
    return {
        "runs": runs,
        "handoffs_per_run": median([x["handoffs"] for x in runs["actors"]]),
        "seconds_per_token": {s: median([x["wall_s"] / x["tokens"] for x in runs[s]]) for s in runs},
        "added_s_per_handoff": median(added),
        "added_s_per_handoff_samples": added,
    }


async def bench_kill(paths, vocab) -> dict:
    """Seconds from ray.kill of the large model's actor, in the middle of a run, until every request has ended."""
    import ray

    engine = Engine(models=specs(paths, True, "float64"), policy=RStitch(tau=0.2), num_threads=1)
    await engine.start()
    ended: dict = {}
    t_kill = None
    try:
        async with anyio.create_task_group() as tg:

            async def one(i, p):
                out = await engine.generate(p, SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True))
                ended[i] = (time.perf_counter(), out.finish_reason, out.error)

            for i, p in enumerate(prompts(8, vocab, 2000)):
                tg.start_soon(one, i, p)
            while engine.stats()["large"].handoffs_received < 8:
                await anyio.sleep(0.01)
            t_kill = time.perf_counter()
            ray.kill(workers_of(engine)["large"].handle, no_restart=True)
    finally:
        await engine.close()
    times = [t - t_kill for t, _, _ in ended.values()]
    return {
        "requests": len(ended),
        "ended_with_error": sum(r == "error" for _, r, _ in ended.values()),
        "seconds_to_last_end": max(times),
        "seconds_to_first_end": min(times),
        "error": next(iter(ended.values()))[2],
    }


def table(results: dict) -> str:
    lines = [
        "| pair | C | in-process tokens/s | actors tokens/s | actors / in-process | hand-offs per run "
        "| transport share of step time (small, large) |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in results["pairs"]:
        for C, level in pair["levels"].items():
            share = level["actors"]["transport_share"]
            lines.append(
                f"| {pair['pair']} | {C} | {level['in_process']['tokens_per_s']:.1f} "
                f"| {level['actors']['tokens_per_s']:.1f} | "
                f"{level['actors_over_in_process']:.2f} | {level['actors']['handoffs']:.0f} | "
                f"{100 * share['small']:.1f}%, {100 * share['large']:.1f}% |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--smollm2-tau", type=float, default=0.25)
    ap.add_argument(
        "--ray-calls", action="store_true", help="actors without the direct channels: everything by Ray calls"
    )
    ap.add_argument("--no-kill", action="store_true", help="skip the kill measurement")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": NODES["small"]})
    cluster.add_node(num_cpus=2, resources=NODES["large"])
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "ray": ray.__version__,
            "load_average_at_start": os.getloadavg(),
        },
        "settings": vars(args) | {"out": str(args.out)},
        "pairs": [],
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tiny = tiny_pair(Path(tmp))
            from tokenrouter.testing import build_tokenizer

            tiny_vocab = len(build_tokenizer())
            for pair in args.pairs:
                if pair == "tiny":
                    res = anyio.run(
                        bench_pair,
                        "tiny",
                        tiny,
                        "float64",
                        lambda: RStitch(tau=0.2),
                        args.concurrency,
                        args.repeats,
                        args.max_tokens,
                        tiny_vocab,
                        args.ray_calls,
                    )
                else:
                    from tokenrouter import store

                    path = store.ensure_model("smollm2")
                    paths = {"small": path, "large": path}
                    res = anyio.run(
                        bench_pair,
                        "smollm2",
                        paths,
                        "float32",
                        lambda: RStitch(tau=args.smollm2_tau),
                        args.concurrency,
                        args.repeats,
                        args.max_tokens,
                        49152,
                        args.ray_calls,
                    )
                results["pairs"].append(res)
            results["handoff"] = anyio.run(bench_handoff, tiny, args.repeats, 64, tiny_vocab, args.ray_calls)
            if not args.no_kill:
                results["kill"] = anyio.run(bench_kill, tiny, tiny_vocab)
    finally:
        results["machine"]["load_average_at_end"] = os.getloadavg()
        ray.shutdown()
        cluster.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    h = results["handoff"]
    print(
        f"added per hand-off: {1e3 * h['added_s_per_handoff']:.2f} ms; "
        f"link round trips: {results['pairs'][0]['link_rtt_s']}"
    )
    print(f"kill: {results.get('kill')}")


if __name__ == "__main__":
    main()
