"""Train the router of a learned policy (CITER, R2R, CoLLM) on token labels, and evaluate routed
systems teacher-forced on labels.

`train_router(labels, kind)` fits a `RouterNet` on the small model's features of the labelled
tokens (in the exact layout `routers.router_features` builds when serving) and picks its
decision threshold on a held-out split of the examples (never of tokens, so that no example
is in both), for a target recall of hard tokens or a target large-model share. The threshold
is chosen for the comparison each policy applies (R2R defers when p >= t, CoLLM when p > t,
CITER when its confidence < t), in float32 as the router computes, so the held-out recall it
reports is what the policy reproduces on those tokens.

A token is *hard* when the small model's greedy token differs from the large model's
(`labels.sufficient > 0`). R2R and CoLLM predict hard; CITER predicts that the small token is
right (not hard).

`teacher_forced_eval(labels, policy)` replays a routed system over the labelled tokens: every
position sees the reference prefix, the large model writes where the policy sends it, and the
routed token (the writer's greedy token) is compared with the large model's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError
from ..policies import RouterConfig, RouterNet, load_router
from .labels import Labels

KINDS = ("r2r", "citer", "collm")
DEFAULT_RECALL = 0.95
COMPARISON = {"r2r": "p >= threshold", "collm": "p > threshold", "citer": "confidence < threshold"}


def _policy_class(kind: str):
    from ..policies import CITER, R2R, CoLLM

    return {"r2r": R2R, "citer": CITER, "collm": CoLLM}[kind]


def defer(kind: str, p: torch.Tensor, threshold: float) -> torch.Tensor:
    """Rows the policy of this kind sends to the large model: its own `defer`, applied to p."""
    return _policy_class(kind).defer(p, float(threshold))


def features(labels: Labels, kind: str, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The router's input rows for the labelled tokens, in `router_features`' layout (float32)."""
    hidden = labels.hidden if rows is None else labels.hidden[rows]
    if kind != "r2r":
        return hidden.float()
    emb = labels.token_embedding if rows is None else labels.token_embedding[rows]
    top = labels.top_logprobs if rows is None else labels.top_logprobs[rows]
    return torch.cat([hidden.float(), emb.float(), top.float()], dim=-1)


def split_examples(labels: Labels, heldout: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(train rows, held-out rows): a seeded split of the examples, at least one on each side."""
    if isinstance(heldout, bool) or not isinstance(heldout, (int, float)) or not 0.0 < heldout < 1.0:
        raise ConfigError(f"heldout must be a fraction in (0, 1), got {heldout!r}")
    present = torch.unique(labels.example)
    if len(present) < 2:
        raise ConfigError(
            f"labels: {len(present)} example(s) with tokens; a held-out split needs at least 2 (label more examples)"
        )
    g = torch.Generator().manual_seed(seed)
    order = present[torch.randperm(len(present), generator=g)]
    n_held = min(max(1, round(heldout * len(present))), len(present) - 1)
    held = torch.isin(labels.example, order[:n_held])
    return torch.nonzero(~held).squeeze(1), torch.nonzero(held).squeeze(1)


def auc(scores: torch.Tensor, positive: torch.Tensor) -> float | None:
    """Area under the ROC curve of `scores` for `positive` (Mann-Whitney, ties at half); None
    when a class is absent."""
    pos = positive.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    sorted_s, order = torch.sort(scores.double())
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    mean_rank = torch.cumsum(counts, 0).double() - (counts.double() - 1) / 2  # ties share their mean rank
    ranks = torch.empty(len(sorted_s), dtype=torch.float64)
    ranks[order] = mean_rank[inverse]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _f32_next(x: float, direction: float) -> float:
    """The float32 value next to float32(x) towards `direction` (a float32, returned as a float)."""
    t = torch.tensor(x, dtype=torch.float32)
    return float(torch.nextafter(t, torch.tensor(direction, dtype=torch.float32)))


def threshold_for_count(kind: str, p: torch.Tensor, k: int) -> float:
    """The threshold under which the policy of this kind defers the k rows of `p` it ranks most
    deferrable (ties may add more), and as few others as its comparison allows; in [0, 1]."""
    p = p.float()
    if kind == "citer":  # defers confidence < t: the k lowest
        ranked = torch.sort(p).values
        if k <= 0:
            return float(ranked[0]) if len(ranked) else 0.0  # nothing is < the minimum
        return min(1.0, _f32_next(float(ranked[min(k, len(ranked)) - 1]), math.inf))
    ranked = torch.sort(p, descending=True).values
    if kind == "r2r":  # defers p >= t: the k highest
        if k <= 0:
            return min(1.0, _f32_next(float(ranked[0]), math.inf)) if len(ranked) else 1.0
        return float(ranked[min(k, len(ranked)) - 1])
    # collm defers p > t
    if k <= 0:
        return float(ranked[0]) if len(ranked) else 1.0
    return max(0.0, _f32_next(float(ranked[min(k, len(ranked)) - 1]), -math.inf))


def routing_metrics(kind: str, p: torch.Tensor, hard: torch.Tensor, threshold: float) -> dict[str, float]:
    """Recall of hard tokens, large-model share and precision of the policy's deferrals, and AUC."""
    deferred = defer(kind, p, threshold)
    hard = hard.bool()
    n_hard, n_def = int(hard.sum()), int(deferred.sum())
    out = {
        "recall": (int((deferred & hard).sum()) / n_hard) if n_hard else 1.0,
        "large_share": n_def / len(p) if len(p) else 0.0,
        "precision": (int((deferred & hard).sum()) / n_def) if n_def else 0.0,
        "hard_share": n_hard / len(p) if len(p) else 0.0,
    }
    a = auc(1.0 - p.double() if kind == "citer" else p.double(), hard)
    if a is not None:
        out["auc"] = a
    return out


def train_router(
    labels: Labels,
    kind: str,
    target_recall: float | None = None,
    large_share: float | None = None,
    heldout: float = 0.2,
    epochs: int | None = None,
    seed: int = 0,
    width: int = 256,
    progress: bool = True,
    batch_size: int = 256,
    lr: float = 1e-3,
) -> tuple[RouterNet, dict[str, float]]:
    """Fit a router of `kind` ("r2r", "citer" or "collm") on two-model labels and pick its
    threshold on the held-out examples: for `target_recall` of hard tokens (default 0.95) or for
    a `large_share` of tokens deferred. Returns the router (its config holds the threshold, the
    pair's identities and the held-out metrics) and the metrics. Deterministic for a seed.

    `epochs` defaults to enough for about 500 optimizer steps, between 3 and 50 epochs."""
    from tqdm.auto import tqdm

    if kind not in KINDS:
        raise ConfigError(f"train_router: kind must be one of {list(KINDS)}, got {kind!r}")
    if labels.num_models != 2:
        raise ConfigError(
            f"train_router: routers decide between two models; these labels have {labels.num_models} "
            f"({', '.join(labels.model_names)}); label a small and a large model"
        )
    if target_recall is not None and large_share is not None:
        raise ConfigError("train_router: give a target recall or a large-model share, not both")
    if large_share is None and target_recall is None:
        target_recall = DEFAULT_RECALL
    if target_recall is not None and not (0.0 < target_recall <= 1.0):
        raise ConfigError(f"train_router: target recall must be in (0, 1], got {target_recall!r}")
    if large_share is not None and not (0.0 <= large_share <= 1.0):
        raise ConfigError(f"train_router: large-model share must be in [0, 1], got {large_share!r}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ConfigError(f"train_router: epochs must be a positive integer, got {epochs!r}")

    train_rows, held_rows = split_examples(labels, heldout, seed)
    hard = labels.hard
    target = hard.float() if kind != "citer" else (~hard).float()
    x_train, y_train = features(labels, kind, train_rows), target[train_rows]
    x_held = features(labels, kind, held_rows)
    n = len(train_rows)
    n_pos = float(y_train.sum())
    pos_weight = torch.tensor((n - n_pos) / n_pos if 0 < n_pos < n else 1.0)

    steps_per_epoch = math.ceil(n / batch_size)
    if epochs is None:
        epochs = max(3, min(50, math.ceil(500 / steps_per_epoch)))
    config = RouterConfig(
        kind=kind,
        hidden_size=labels.hidden_size,
        top_k=labels.top_k if kind == "r2r" else RouterConfig.model_fields["top_k"].default,
        width=width,
        threshold=0.5,
        small=labels.identities[0],
        large=labels.identities[1],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = RouterNet(config)
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
        net.train()
        bar = tqdm(
            total=epochs * steps_per_epoch,
            desc=f"training {kind} router",
            unit="step",
            file=sys.stderr,
            disable=None if progress else True,
        )
        last = float("nan")
        for _ in range(epochs):
            order = torch.randperm(n, generator=g)
            total = 0.0
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                loss = loss_fn(net(x_train[idx]), y_train[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
                bar.update(1)
            last = total / n
            bar.set_postfix(loss=f"{last:.4f}")
        bar.close()
    net.eval()

    p_held = net.probability(x_held)
    hard_held = hard[held_rows]
    if target_recall is not None:
        n_hard = int(hard_held.sum())
        if n_hard == 0:
            raise ConfigError(
                "train_router: the held-out examples have no hard tokens, so no threshold can be picked for a "
                "recall; label more examples or give a large-model share"
            )
        k = min(n_hard, math.ceil(target_recall * n_hard - 1e-9))
        threshold = threshold_for_count(kind, p_held[hard_held], k)
    else:
        threshold = threshold_for_count(kind, p_held, round(large_share * len(held_rows)))
    net.config.threshold = threshold

    metrics = routing_metrics(kind, p_held, hard_held, threshold)
    p_train = net.probability(x_train).double()
    train_auc = auc(1.0 - p_train if kind == "citer" else p_train, hard[train_rows])
    metrics.update(
        {
            "threshold": threshold,
            "tokens_train": float(n),
            "tokens_heldout": float(len(held_rows)),
            "examples_train": float(len(torch.unique(labels.example[train_rows]))),
            "examples_heldout": float(len(torch.unique(labels.example[held_rows]))),
            "heldout_fraction": float(heldout),
            "epochs": float(epochs),
            "seed": float(seed),
            "train_loss": last,
        }
    )
    if train_auc is not None:
        metrics["train_auc"] = train_auc
    if target_recall is not None:
        metrics["target_recall"] = float(target_recall)
    else:
        metrics["target_large_share"] = float(large_share)
    net.config.metrics = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
    return net, metrics


# ---- teacher-forced evaluation -----------------------------------------------------------------------
def _rows(labels: Labels, split: str, heldout: float, seed: int) -> torch.Tensor:
    if split == "all":
        return torch.arange(len(labels))
    if split not in ("train", "heldout"):
        raise ConfigError(f"teacher_forced_eval: split must be 'heldout', 'train' or 'all', got {split!r}")
    train, held = split_examples(labels, heldout, seed)
    return held if split == "heldout" else train


def _rstitch_writers(labels: Labels, rows: torch.Tensor, tau: float) -> torch.Tensor:
    """Per row (in `rows` order): True where RStitch's large model writes the position."""
    order = sorted(range(len(rows)), key=lambda i: (int(labels.example[rows[i]]), int(labels.position[rows[i]])))
    h_small = labels.entropy[rows, 0].tolist()
    h_large = labels.entropy[rows, -1].tolist()
    ex = labels.example[rows].tolist()
    large = [False] * len(rows)
    on_large, current = False, None
    for i in order:
        if ex[i] != current:  # every example starts on the small model
            on_large, current = False, ex[i]
        if not on_large and h_small[i] > tau:  # the small model's token is discarded; the large one writes
            on_large = True
        if on_large:
            large[i] = True
            on_large = h_large[i] > tau  # it keeps writing while unsure; its first sure token returns control
    return torch.tensor(large, dtype=torch.bool)


def teacher_forced_eval(
    labels: Labels,
    policy_name: str,
    *,
    router: RouterNet | str | Path | None = None,
    threshold: float | None = None,
    tau: float | None = None,
    split: str = "heldout",
    heldout: float = 0.2,
    seed: int = 0,
) -> dict:
    """A routed system replayed over labelled tokens (two models), each position with the
    reference prefix: the share of positions the large model writes and the agreement of the
    routed token (the large model's greedy token where it writes, else the small one's) with the
    large model's greedy token.

    policy_name: "r2r", "citer" or "collm" (give `router`, a RouterNet or its directory, and
    optionally `threshold`, default the router's), "rstitch" (give `tau`), "large" or "small".
    split: "heldout" (the examples `train_router` held out for the same `heldout` and `seed`),
    "train" or "all"."""
    if labels.num_models != 2:
        raise ConfigError(f"teacher_forced_eval: needs labels of two models, got {labels.num_models}")
    rows = _rows(labels, split, heldout, seed)
    small_g, large_g = labels.greedy[rows, 0], labels.greedy[rows, -1]
    if policy_name in KINDS:
        if router is None:
            raise ConfigError(f"teacher_forced_eval: policy {policy_name!r} needs a router")
        net = router if isinstance(router, RouterNet) else load_router(router, policy_name)
        if net.config.kind != policy_name:
            raise ConfigError(f"teacher_forced_eval: the router is a {net.config.kind!r} one, not {policy_name!r}")
        t = net.config.threshold if threshold is None else float(threshold)
        p = net.probability(features(labels, policy_name, rows)) if len(rows) else torch.zeros(0)
        writes_large = defer(policy_name, p, t)
        params = {"threshold": t}
    elif policy_name == "rstitch":
        if tau is None or not 0.0 <= tau <= 1.0:
            raise ConfigError(f"teacher_forced_eval: rstitch needs tau in [0, 1], got {tau!r}")
        writes_large = _rstitch_writers(labels, rows, float(tau))
        params = {"tau": float(tau)}
    elif policy_name in ("large", "small"):
        writes_large = torch.full((len(rows),), policy_name == "large", dtype=torch.bool)
        params = {}
    else:
        raise ConfigError(
            f"teacher_forced_eval: unknown policy {policy_name!r}; expected r2r, citer, collm, rstitch, large or small"
        )
    routed = torch.where(writes_large, large_g, small_g)
    n = len(rows)
    return {
        "policy": policy_name,
        **params,
        "split": split,
        "examples": len(torch.unique(labels.example[rows])),
        "tokens": n,
        "large_share": float(writes_large.float().mean()) if n else 0.0,
        "agreement": float((routed == large_g).float().mean()) if n else 0.0,
    }


__all__ = [
    "KINDS",
    "auc",
    "defer",
    "features",
    "routing_metrics",
    "split_examples",
    "teacher_forced_eval",
    "threshold_for_count",
    "train_router",
]
