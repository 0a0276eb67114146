"""The single-model benchmark's token check: each system's greedy tokens against Hugging Face generate at
batch 1, prompt by prompt, with where they first diverge (float32 near-ties can flip a token)."""

from __future__ import annotations

from benchmarks.anchors.hf_baselines import hf_generate_run
from benchmarks.anchors.single_runs import Runs, in_fresh_thread
from benchmarks.anchors.single_workload import Workload


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict:
    same = sum(a == b for a, b in zip(ref, other))
    div = [first_divergence(a, b) for a, b in zip(ref, other)]
    return {"identical": same, "of": len(ref), "first_divergence": div}


def token_checks(runs: Runs, work: Workload) -> tuple[dict, list[str]]:
    """({"SYSTEM_cC_vs_hf_generate_b1": agreement}, warnings): the first run of every system and concurrency
    against hf_generate's run at concurrency 1 (or, without one, a batch-1 run of the first two prompts),
    and a warning for each of the first two prompts where the engine's tokens differ."""
    results = runs.results
    checks: dict = {}
    warnings: list[str] = []
    ref_b1 = None
    if "hf_generate" in results and 1 in results["hf_generate"]:
        ref_b1 = results["hf_generate"][1][0].tokens
    elif "engine" in results:
        ref_b1 = in_fresh_thread(hf_generate_run, runs.model, work.pad_id, work.prompts[:2], 1, work.lengths[:2]).tokens
    if ref_b1 is None:
        return checks, warnings
    for name, res in results.items():
        for c, system_runs in res.items():
            if not isinstance(c, int) or (name == "hf_generate" and c == 1):
                continue
            toks = system_runs[0].tokens[: len(ref_b1)]
            checks[f"{name}_c{c}_vs_hf_generate_b1"] = agreement(ref_b1, toks)
    eng1 = results.get("engine", {}).get(1)
    if eng1 is None and "engine" in results:
        eng1 = next(v for k, v in results["engine"].items() if isinstance(k, int))
    if eng1 is not None:
        for i in range(min(2, len(ref_b1))):
            d = first_divergence(ref_b1[i], eng1[0].tokens[i])
            if d is not None:
                warnings.append(
                    f"WARNING: prompt {i}: engine greedy tokens differ from HF generate (batch 1) "
                    f"from output position {d} (float32 near-ties can flip)"
                )
    return checks, warnings
