"""Teacher-forced labelling: which model suffices for each token of a reference corpus.

`label(models, examples)` teacher-forces every model (smallest first) over the same token ids:
each example's prompt (through the smallest model's chat template, with the generation prompt)
followed by its reference response. For every response position it records each model's greedy
token and normalized entropy, the *sufficient-compute map* (the smallest model whose greedy token
equals the largest model's; the largest always suffices) and the smallest model's step features,
in the layout `routers.router_features` builds at serving time (last hidden state, the input
embedding of its greedy token, its top-100 log-probabilities). What it returns, and how that is
saved, is labels.py; the examples come from corpus.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from ..api import chat_ids
from ..errors import ConfigError
from ..policies import R2R_TOP_K, ModelIdentity, model_identity, normalized_entropy
from .corpus import check_example
from .labels import Labels

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _resolve(name: str, where) -> Path:
    """A path, or a store name (already pulled; `tokenrouter label` pulls it first)."""
    from .. import store
    from ..errors import ModelNotFoundError

    try:
        return store.locate_model(where)
    except ModelNotFoundError as e:
        raise ConfigError(f"label: model {name}={e.where}: {e.reason}") from None


def _load_tokenizer(path: Path):
    from ..config import ModelSpec
    from ..engine import load_tokenizer

    return load_tokenizer(ModelSpec(path=path))


def _load_model(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from ..engine import dense_checkpoint
    from ..errors import ModelLoadError

    directory = dense_checkpoint(path)  # a GGUF's dense copy, written once
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load {path}: {e}") from e
    return model.eval()


def encode_example(tokenizer, example: Mapping, max_tokens: int | None) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of an example: the prompt through the chat template with the
    generation prompt (plain text when the tokenizer has none), the response truncated."""
    prompt = example["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None):
        prompt_ids = chat_ids(tokenizer, messages)
    elif isinstance(prompt, str):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
    else:
        raise ConfigError(
            "label: chat-message prompts need a chat template, and the smallest model's tokenizer has none"
        )
    response_ids = tokenizer.encode(example["response"], add_special_tokens=False)
    if max_tokens is not None:
        response_ids = response_ids[:max_tokens]
    return [int(i) for i in prompt_ids], [int(i) for i in response_ids]


@torch.inference_mode()
def _teacher_force(model, ids: list[int], num_response: int, features: bool):
    """Logits (and the head's input) predicting each of the last `num_response` tokens."""
    from ..engine import HiddenCapture

    capture = HiddenCapture(model) if features else None
    try:
        out = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=num_response + 1)
        hidden = capture.take()[0] if capture is not None else None
    finally:
        if capture is not None:
            capture.remove()
    logits = out.logits[0, -(num_response + 1) : -1]
    if hidden is not None:
        hidden = hidden[-(num_response + 1) : -1]
    return logits, hidden


def label(
    models: Mapping[str, str | Path],
    examples: Iterable[Mapping],
    max_tokens_per_example: int | None = 256,
    dtype: torch.dtype | str = torch.float32,
    progress: bool = True,
    source: str = "",
) -> Labels:
    """Teacher-force every model (smallest first, in dict order) over each example and label
    every response token; see the module docstring. Models are Hugging Face directories, .gguf
    files or store names; they are loaded one at a time."""
    from tqdm.auto import tqdm

    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ConfigError(f"label: dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        dtype = _DTYPES[dtype]
    names = list(models)
    if len(names) < 2:
        raise ConfigError(f"label: give two or more models, smallest first, got {names}")
    if max_tokens_per_example is not None and (isinstance(max_tokens_per_example, bool) or max_tokens_per_example < 1):
        raise ConfigError(f"label: max_tokens_per_example must be >= 1, got {max_tokens_per_example!r}")
    examples = [check_example(e, f"example {i}") for i, e in enumerate(examples)]
    if not examples:
        raise ConfigError("label: no examples")
    paths = [_resolve(n, models[n]) for n in names]

    tokenizers = [_load_tokenizer(p) for p in paths]
    vocab0 = tokenizers[0].get_vocab()
    for n, t in zip(names[1:], tokenizers[1:]):
        if t.get_vocab() != vocab0:
            raise ConfigError(
                f"label: the tokenizers of {names[0]!r} and {n!r} differ; routing needs models that share a vocabulary"
            )
    encoded = [encode_example(tokenizers[0], e, max_tokens_per_example) for e in examples]
    for i, (p, _) in enumerate(encoded):
        if not p:
            raise ConfigError(f"label: example {i}: the prompt encodes to no tokens")

    m = len(names)
    greedy_cols: list[torch.Tensor] = []
    entropy_cols: list[torch.Tensor] = []
    identities: list[ModelIdentity] = []
    num_params: list[int] = []
    feats: dict[str, list[torch.Tensor]] = {"hidden": [], "token_embedding": [], "top_logprobs": []}
    top_k = R2R_TOP_K
    for i, (name, path) in enumerate(zip(names, paths)):
        model = _load_model(path, dtype)
        identities.append(model_identity(model))
        num_params.append(sum(p.numel() for p in model.parameters()))
        small = i == 0
        if small:
            vocab = model.get_output_embeddings().weight.shape[0]
            if vocab < top_k:
                raise ConfigError(f"label: {name!r} has {vocab} logits per token, fewer than the router's top-{top_k}")
        greedy, entropy = [], []
        bar = tqdm(
            encoded,
            desc=f"labelling with {name} ({i + 1}/{m})",
            unit="example",
            file=sys.stderr,
            disable=None if progress else True,
        )
        for prompt_ids, response_ids in bar:
            r = len(response_ids)
            if r == 0:
                continue
            logits, hidden = _teacher_force(model, prompt_ids + response_ids, r, features=small)
            g = logits.argmax(dim=-1)
            greedy.append(g)
            entropy.append(normalized_entropy(logits).float())
            if small:
                with torch.inference_mode():
                    feats["hidden"].append(hidden.float())
                    feats["token_embedding"].append(model.get_input_embeddings()(g).float())
                    feats["top_logprobs"].append(torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1).values)
        bar.close()
        greedy_cols.append(torch.cat(greedy) if greedy else torch.zeros(0, dtype=torch.long))
        entropy_cols.append(torch.cat(entropy) if entropy else torch.zeros(0))
        del model

    greedy_all = torch.stack(greedy_cols, dim=1)  # [N, M]
    # the smallest model whose greedy token is the largest model's (the largest always matches)
    matches = greedy_all == greedy_all[:, -1:]
    sufficient = matches.long().argmax(dim=1)  # first True
    example_idx = torch.cat([torch.full((len(r),), j, dtype=torch.long) for j, (_, r) in enumerate(encoded)])
    position = torch.cat([torch.arange(len(r), dtype=torch.long) for _, r in encoded])
    token = torch.tensor([t for _, r in encoded for t in r], dtype=torch.long)
    h = identities[0].hidden_size

    def stacked(key: str, width: int) -> torch.Tensor:
        return torch.cat(feats[key]).contiguous() if feats[key] else torch.zeros(0, width)

    return Labels(
        model_names=names,
        model_paths=[str(p) for p in paths],
        identities=identities,
        num_parameters=num_params,
        greedy=greedy_all.contiguous(),
        entropy=torch.stack(entropy_cols, dim=1).contiguous(),
        sufficient=sufficient,
        token=token,
        hidden=stacked("hidden", h),
        token_embedding=stacked("token_embedding", h),
        top_logprobs=stacked("top_logprobs", top_k),
        example=example_idx,
        position=position,
        num_examples=len(examples),
        dtype=str(dtype).removeprefix("torch."),
        max_tokens_per_example=max_tokens_per_example,
        source=source,
    )


__all__ = ["encode_example", "label"]
