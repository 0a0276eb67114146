"""From what a caller passes `Engine(...)` to a checked plan: each model's `ModelSpec`, the
policy, and the engine's options (`EngineOptions`, whose fields and descriptions are the one
statement of every option). Nothing is loaded here; every error is a `ConfigError` (or, for the
demo pair missing from the store, a `ModelLoadError`) naming the argument."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..config import EngineOptions, ModelSpec
from ..errors import ConfigError, ModelLoadError
from ..policies import HIDDEN, STEP_FIELDS, VERIFY, Policy, RStitch, Single


@dataclass(frozen=True)
class EnginePlan:
    """What an engine will run: checked, not yet loaded."""

    specs: dict[str, ModelSpec]
    policy: Policy
    options: EngineOptions
    batch_min: dict[str, int]  # B per model at start (delayed batching)
    placed: list[str]  # models whose workers run in Ray actors

    @property
    def auto_batching(self) -> bool:
        return self.options.delayed_batching == "auto"


def plan_engine(
    models: Mapping[str, str | Path | ModelSpec] | None, policy: Policy | None, options: dict
) -> EnginePlan:
    if models is None:
        policy = RStitch(tau=0.03) if policy is None else policy
        models = default_models(policy)
    specs = check_models(models)
    policy = check_policy(policy, specs)
    try:
        opts = EngineOptions.model_validate(options, context={"models": list(specs)})
    except ValidationError as e:
        raise ConfigError(first_error(e)) from None
    if opts.deterministic:
        specs = {name: deterministic(name, spec) for name, spec in specs.items()}
    placed = [name for name, spec in specs.items() if spec.placement is not None]
    check_placement(placed, opts)
    return EnginePlan(specs, policy, opts, opts.batch_min(list(specs)), placed)


def deterministic(name: str, spec: ModelSpec) -> ModelSpec:
    """`spec` with deterministic=True, checked as if the caller had asked it of that model."""
    try:
        return ModelSpec.model_validate({**dict(spec), "deterministic": True})
    except ValidationError as e:
        raise ConfigError(f"models[{name!r}]: {first_error(e)}") from None


def check_models(models) -> dict[str, ModelSpec]:
    if not isinstance(models, Mapping):
        raise ConfigError(f"models: must be a dict of name -> path or ModelSpec, got {type(models).__name__}")
    if not models:
        raise ConfigError("models: give at least one model, e.g. Engine(models={'m': 'path/to/model'})")
    specs: dict[str, ModelSpec] = {}
    for name, value in models.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"models: model names must be non-empty strings, got {name!r}")
        try:
            specs[name] = ModelSpec.coerce(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"models[{name!r}]: {e}") from e
    return specs


def check_policy(policy: Policy | None, specs: dict[str, ModelSpec]) -> Policy:
    """The policy (Single for one model), which names only these models and asks only for what
    a step provides."""
    if policy is None:
        if len(specs) != 1:
            raise ConfigError("policy: several models need a routing policy")
        policy = Single(next(iter(specs)))
    if not isinstance(policy, Policy):
        raise ConfigError(f"policy: must be a Policy, got {type(policy).__name__}")
    unknown = sorted(set(policy.requires) - STEP_FIELDS)
    if unknown:
        raise ConfigError(f"policy: requires step-result fields {unknown} that the engine does not provide")
    missing = [m for m in policy.models if m not in specs]
    if missing:
        raise ConfigError(f"policy: names model(s) {missing} that are not in models {sorted(specs)}")
    if VERIFY in policy.requires:
        check_verifying(policy, specs)
    return policy


def check_verifying(policy: Policy, specs: dict[str, ModelSpec]) -> None:
    """A verifying policy bounds its drafts, and its verifier computes a whole check in one step."""
    md = policy.max_draft
    if isinstance(md, bool) or not isinstance(md, int) or md < 1:
        raise ConfigError(f"policy: a verifying policy needs max_draft, an int >= 1, got {md!r}")
    if HIDDEN in policy.requires:
        raise ConfigError(
            "policy: VERIFY and HIDDEN together are not supported (the hidden state of a corrected position)"
        )
    budget = specs[policy.verifier].max_num_batched_tokens
    if md + 1 > budget:
        raise ConfigError(
            f"policy: max_draft={md} needs {md + 1} tokens in one step of {policy.verifier!r}, whose "
            f"max_num_batched_tokens is {budget}"
        )


def check_placement(placed: list[str], options: EngineOptions) -> None:
    """Ray options need a placed model; placed models need Ray, and their own stepping threads."""
    if not placed:
        for name in ("ray_address", "placement_strategy"):
            if getattr(options, name) is not None:
                raise ConfigError(f"{name}: no model has a placement (ModelSpec(placement=RayPlacement(...)))")
        return
    from ..distributed import ray_installed

    if not ray_installed():
        raise ConfigError(f"models[{placed[0]!r}].placement: needs Ray: pip install 'tokenrouter[ray]'")
    if options.mode == "lockstep":
        raise ConfigError(
            "mode: 'lockstep' steps every model from one thread, so no model can be placed in a Ray actor"
        )


def default_models(policy: Policy) -> dict[str, ModelSpec]:
    """The demo pair from the store, for a policy that names its models "small" and "large"."""
    from .. import store

    if not isinstance(policy, Policy):
        raise ConfigError(f"policy: must be a Policy, got {type(policy).__name__}")
    unknown = [m for m in policy.models if m not in store.DEFAULT_MODELS]
    if unknown:
        raise ConfigError(
            f"models: not given, and the default demo pair only provides {sorted(store.DEFAULT_MODELS)}, "
            f"while the policy names {unknown}"
        )
    paths, missing = {}, []
    for m in policy.models:
        try:
            paths[m] = store.locate_model(store.DEFAULT_MODELS[m])
        except ModelLoadError:
            missing.append(store.DEFAULT_MODELS[m])
    if missing:
        raise ModelLoadError(
            f"models: not given, so the engine serves the demo pair, but {missing} is not in the store at "
            f"{store.home_dir()}; fetch it with `{store.pull_command('demo')}` (or pass models=...)"
        )
    return {m: ModelSpec(path=path) for m, path in paths.items()}


# what ModelSpec fields each named precision sets ("auto": the defaults, which resolve at load)
PRECISIONS = {
    "auto": {},
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "gguf": {"quantization": "gguf"},
    "gguf+bf16": {"quantization": "gguf+bf16"},
}


def spec_in_precision(path, precision: str = "auto", **fields) -> ModelSpec:
    """A model's spec in one of `PRECISIONS` (the command line's --precision, eval's setting)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return ModelSpec(path=path, **fields, **PRECISIONS[precision])


def first_error(e: ValidationError) -> str:
    """The first error of a validation, as "<argument>: <what is wrong>"."""
    err = e.errors()[0]
    if err["type"] == "value_error":  # our own checks name the argument themselves
        return str(err["ctx"]["error"])
    where = ".".join(str(x) for x in err["loc"])
    return f"{where}: {err['msg']}"


def check_tokenizers(policy: Policy, loaded: dict) -> None:
    """Routed models must share one vocabulary: a token id must mean the same to each of them
    (checked once they are loaded)."""
    names = policy.models
    first = loaded[names[0]]
    vocab = first.tokenizer.get_vocab()
    for name in names[1:]:
        other = loaded[name]
        if other.tokenizer.get_vocab() != vocab:
            raise ConfigError(
                f"models {names[0]!r} ({first.spec.path}) and {name!r} ({other.spec.path}) have different "
                "tokenizers; token-level routing needs one shared vocabulary"
            )
