"""Where the fleet's actors go and what they run with, checked and set before any is created.

A placement the cluster cannot hold would leave an actor (or the placement group) waiting
forever, so the fleet checks it against the cluster's nodes first (`check_feasible`). Each actor
gets the caller's `runtime_env` with offline Hugging Face and this code first on its path
(`runtime_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..config import ModelSpec
from ..errors import ConfigError

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory this tokenrouter is imported from


def runtime_env(given: dict | None) -> dict:
    """The actor's runtime_env: the caller's, plus offline Hugging Face and this code first on
    PYTHONPATH (where the path does not exist, on another machine, it is skipped)."""
    env = dict(given or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault("HF_HUB_OFFLINE", "1")
    env_vars.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env_vars.setdefault("PYTHONPATH", PACKAGE_ROOT + os.pathsep + "${PYTHONPATH}")
    env["env_vars"] = env_vars
    return env


def check_feasible(ray, specs: Mapping[str, ModelSpec], placed: list[str], strategy: str | None) -> None:
    """The cluster has the resources asked for (else an actor or the placement group would
    wait forever): each placed model's on some live node, and under STRICT_PACK all of them on
    one node, under STRICT_SPREAD each on a node of its own. Totals, not what is free now: a
    busy cluster is waited for."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    shown = [{k: v for k, v in n.items() if not k.startswith("node:")} for n in nodes]
    needs = {name: specs[name].placement.bundle for name in placed}
    for name, need in needs.items():
        if not any(fits(need, node) for node in nodes):
            raise ConfigError(f"models[{name!r}].placement: no node of the Ray cluster has {need} (nodes: {shown})")
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for need in needs.values():
            for k, v in need.items():
                total[k] = total.get(k, 0.0) + v
        if not any(fits(total, node) for node in nodes):
            raise ConfigError(f"placement_strategy: STRICT_PACK needs one node with {total} (nodes: {shown})")
    elif strategy == "STRICT_SPREAD" and not spread(list(needs.values()), nodes):
        raise ConfigError(
            f"placement_strategy: STRICT_SPREAD needs a node of its own for each of {list(needs.values())} "
            f"(nodes: {shown})"
        )


def fits(need: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in need.items())


def spread(needs: list[dict], nodes: list[dict]) -> bool:
    """Whether each need can have a node of its own (a small matching, by backtracking)."""
    if not needs:
        return True
    first, rest = needs[0], needs[1:]
    return any(fits(first, node) and spread(rest, nodes[:i] + nodes[i + 1 :]) for i, node in enumerate(nodes))
