"""From command-line arguments to what runs: the policy, where each model is, the device, the
sampling parameters and the engine (generate, chat, bench and eval share these)."""

from __future__ import annotations

from pathlib import Path

from .. import store
from .arguments import DEFAULT_FALLBACK, DEFAULT_K, DEFAULT_ROLLBACK, KNOBS, LEARNED, UsageError


def policy_from_args(args):
    from ..policies import CITER, R2R, BiLD, CoLLM, Escalation, RStitch, Single, Speculative

    for flag, (attr, owners) in KNOBS.items():
        if getattr(args, attr) is not None and args.policy not in owners:
            raise UsageError(f"{flag} is only for --policy {' or '.join(owners)}")
    if args.policy not in LEARNED:
        for flag, value in (("--router", args.router), ("--threshold", args.threshold)):
            if value is not None:
                raise UsageError(f"{flag} is only for --policy citer, r2r or collm")
    if args.taus is not None and args.policy != "escalation":
        raise UsageError("--taus is only for --policy escalation")
    if args.policy == "speculative":
        return Speculative(k=DEFAULT_K if args.k is None else args.k)
    if args.policy == "bild":
        return BiLD(
            fallback=DEFAULT_FALLBACK if args.fallback is None else args.fallback,
            rollback=DEFAULT_ROLLBACK if args.rollback is None else args.rollback,
        )
    if args.policy in LEARNED:
        if args.router is None:
            raise UsageError(
                f"--policy {args.policy} needs --router DIR, a router trained for the pair by "
                f"`tokenrouter train-router --policy {args.policy}`"
            )
        if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
            raise UsageError(f"--threshold must be in [0, 1], got {args.threshold}")
        cls = {"citer": CITER, "r2r": R2R, "collm": CoLLM}[args.policy]
        return cls(Path(args.router).expanduser(), threshold=args.threshold)
    if args.policy == "escalation":
        names = [n for n, _ in args.model]
        if len(names) < 2:
            raise UsageError("--policy escalation needs two or more --model NAME=PATH, smallest first")
        taus = args.taus
        if taus is None:
            if not 0.0 <= args.tau <= 1.0:
                raise UsageError(f"--tau must be in [0, 1], got {args.tau}")
            taus = [args.tau] * (len(names) - 1)
        if len(taus) != len(names) - 1:
            raise UsageError(
                f"--taus: give one per model but the largest ({len(names) - 1} for {len(names)} models), "
                f"got {len(taus)}"
            )
        if len(set(names)) != len(names):
            raise UsageError("--model: each NAME may be given once")
        return Escalation(models=names, taus=taus)
    if args.policy == "rstitch":
        if not 0.0 <= args.tau <= 1.0:
            raise UsageError(f"--tau must be in [0, 1], got {args.tau}")
        return RStitch(tau=args.tau)
    if len(args.model) != 1:
        raise UsageError("--policy single needs exactly one --model NAME=PATH, e.g. --model m=qwen-coder-1.5b")
    return Single(args.model[0][0])


def model_path(name: str, where: str, pull: bool) -> Path:
    """A path, or a store name (fetched now unless --no-pull)."""
    from ..errors import ModelNotFoundError

    try:
        return store.locate_model(where, pull=pull)
    except ModelNotFoundError as e:
        raise UsageError(f"--model {name}={e.where}: {e.reason}") from None


def model_paths(args, policy) -> dict[str, Path]:
    """Where each of the policy's models is: --model, else the demo pair (fetched unless --no-pull)."""
    given = dict(args.model)
    if len(given) != len(args.model):
        raise UsageError("--model: each NAME may be given once")
    unknown = sorted(set(given) - set(policy.models))
    if unknown:
        raise UsageError(f"--model {unknown[0]}=...: the {args.policy} policy names its models {policy.models}")
    where = {m: given.get(m) or store.DEFAULT_MODELS.get(m) for m in policy.models}
    return {m: model_path(m, w, not args.no_pull) for m, w in where.items()}


def device_from_arg(arg: str | None) -> str:
    """--device checked: a torch device this machine has; None means cuda if available, else cpu."""
    import torch

    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(arg)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: not a torch device: {arg!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {arg}: CUDA is not available here")
    return arg


def model_spec(name: str, path: Path, precision: str = "auto", **fields):
    """Model `name`'s ModelSpec with --precision applied: auto is what the API gives a caller who
    asks for nothing in particular (the defaults, resolved at load: a GGUF-backed model on CPU
    computes from its blocks where they win, anything else in the dtype a timed probe picks);
    float32 and bfloat16 set dtype, gguf quantization="gguf" or "gguf+bf16". generate, chat and
    bench build every spec here, so the flag means the same in each."""
    from pydantic import ValidationError

    from ..api import first_error, spec_in_precision

    try:
        return spec_in_precision(path, precision, **fields)
    except ValidationError as e:  # e.g. gguf on a GPU
        raise UsageError(f"--precision {precision} ({name}): {first_error(e)}") from None


def models_from_args(args, policy) -> dict:
    device = device_from_arg(args.device)
    return {
        m: model_spec(m, p, args.precision, kv_cache_tokens=args.kv_cache_tokens, device=device)
        for m, p in model_paths(args, policy).items()
    }


def sampling_from_args(args):
    from pydantic import ValidationError

    from ..config import SamplingParams

    try:
        return SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
        )
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-")
        raise UsageError(f"{flag}: {err['msg']}") from None


def engine_from_args(args):
    from ..api import Engine

    policy = policy_from_args(args)
    params = sampling_from_args(args)
    models = models_from_args(args, policy)
    return Engine(models=models, policy=policy, num_threads=args.threads), params
