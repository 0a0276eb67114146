"""Token labels for training routers: which model suffices for each token of a reference corpus.

`label(models, examples)` teacher-forces every model (smallest first) over the same token ids:
each example's prompt (through the smallest model's chat template, with the generation prompt)
followed by its reference response. For every response position it records each model's greedy
token and normalized entropy, the *sufficient-compute map* (the smallest model whose greedy token
equals the largest model's; the largest always suffices) and the smallest model's step features,
in the layout `routers.router_features` builds at serving time (last hidden state, the input
embedding of its greedy token, its top-100 log-probabilities).

A `Labels` object is saved as a directory (`tokenrouter label --out DIR`):

- `labels.safetensors`: the tensors, one row per response token (N rows, M models, H the small
  model's hidden size, K = 100):
  `greedy` int64 [N, M], `entropy` float32 [N, M], `sufficient` int64 [N], `token` int64 [N] (the
  reference token), `hidden` float32 [N, H], `token_embedding` float32 [N, H], `top_logprobs`
  float32 [N, K], `example` int64 [N] (index of the example), `position` int64 [N] (index of the
  token in the example's response);
- `labels.json`: the models (name, path, `ModelIdentity`, number of parameters), the number of
  examples, the dtype, the source and `summary(labels)`.

`python_corpus(n)` builds an offline reference corpus (functions of this machine's Python
standard library); `read_jsonl(path)` reads one of your own.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import random
import sys
import sysconfig
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..api.prompts import chat_ids
from ..errors import ConfigError
from ..files import atomic_path, write_text_atomic
from ..jsonl import read_records
from ..policies.base import normalized_entropy
from ..policies.routers import R2R_TOP_K, ModelIdentity, model_identity, read_saved

LABELS_FILE = "labels.safetensors"
META_FILE = "labels.json"
FORMAT = "tokenrouter-labels"
VERSION = 1
HARDEST_FRACTION = 0.1  # summary: the FLOPs share taken by the hardest 10% of tokens

# name -> (dtype, shape suffix: "M" models, "H" hidden size, "K" top-k)
_TENSORS = {
    "greedy": (torch.int64, ("M",)),
    "entropy": (torch.float32, ("M",)),
    "sufficient": (torch.int64, ()),
    "token": (torch.int64, ()),
    "hidden": (torch.float32, ("H",)),
    "token_embedding": (torch.float32, ("H",)),
    "top_logprobs": (torch.float32, ("K",)),
    "example": (torch.int64, ()),
    "position": (torch.int64, ()),
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---- reference corpora ----------------------------------------------------------------------------
_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"})


def _functions(body: list[ast.stmt]):
    """Function definitions among statements, in source order, nested ones (in classes, functions,
    if/try/with/for blocks) included; expressions are never visited."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        for attr in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, attr, None)
            if (
                isinstance(inner, list)
                and inner
                and isinstance(inner[0], (ast.stmt, ast.excepthandler, ast.match_case))
            ):
                if isinstance(inner[0], ast.stmt):
                    yield from _functions(inner)
                else:
                    for h in inner:
                        yield from _functions(h.body)


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[dict, ...]:
    """Every documented function of the standard library whose source is 200-2000 characters,
    in sorted file order, then source order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    out = []
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts) or rel.stem
        lines = text.splitlines()
        for node in _functions(tree.body):
            doc = ast.get_docstring(node)
            if not doc or not doc.strip():
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            source = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
            if not 200 <= len(source) <= 2000:
                continue
            line = doc.strip().splitlines()[0].strip()
            out.append(
                {"prompt": f"Write a Python function `{node.name}` (module {module}): {line}", "response": source}
            )
    return tuple(out)


def python_corpus(n: int, seed: int = 0) -> list[dict]:
    """`n` {"prompt", "response"} examples from this machine's Python standard library: functions
    with docstrings (tests, idlelib, lib2to3 and site-packages skipped; source of 200 to 2000
    characters); the prompt asks for the function by name, module and the docstring's first line,
    the response is its source. Deterministic for a given Python installation and seed."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"python_corpus: n must be a positive integer, got {n!r}")
    pool = list(_stdlib_functions())
    if n > len(pool):
        raise ConfigError(f"python_corpus: asked for {n} examples, the standard library here has {len(pool)}")
    random.Random(seed).shuffle(pool)
    return [dict(e) for e in pool[:n]]


def _check_example(e, where: str, need_response: bool = True) -> dict:
    if not isinstance(e, Mapping):
        raise ConfigError(f'{where}: expected an object with "prompt" and "response", got {type(e).__name__}')
    missing = [k for k in ("prompt", "response") if k not in e and (k == "prompt" or need_response)]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    prompt, response = e["prompt"], e.get("response")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f'{where}: "prompt" is empty')
    elif isinstance(prompt, list):
        if not prompt:
            raise ConfigError(f'{where}: "prompt" is an empty list of messages')
        for i, m in enumerate(prompt):
            if (
                not isinstance(m, Mapping)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise ConfigError(f'{where}: "prompt"[{i}] must be a chat message {{"role": str, "content": str}}')
    else:
        raise ConfigError(f'{where}: "prompt" must be a string or a list of chat messages, got {type(prompt).__name__}')
    if response is None and not need_response:
        return {"prompt": prompt, "response": None}
    if not isinstance(response, str):
        raise ConfigError(f'{where}: "response" must be a string, got {type(response).__name__}')
    if not response:
        raise ConfigError(f'{where}: "response" is empty')
    return {"prompt": prompt, "response": response}


def read_jsonl(path: str | Path, need_response: bool = True) -> list[dict]:
    """Examples from a JSON Lines file, one {"prompt": str | [chat messages], "response": str} per
    line (blank lines skipped). With `need_response=False` a line may leave the response out
    (`generate_responses` fills it). A bad line is a ConfigError naming the file and line number."""
    examples = [_check_example(record, where, need_response) for where, record in read_records(path)]
    if not examples:
        raise ConfigError(f"{path}: no examples (expected one JSON object per line)")
    return examples


def generate_responses(
    model: str | Path, examples: Sequence[Mapping], max_tokens: int, dtype: str = "auto", num_threads: int | None = None
) -> list[dict]:
    """Fill in the examples that have no response with `model`'s own greedy answer (served by the
    engine, all at once, through the chat template), so that labels can be made from prompts alone."""
    import anyio

    from ..api import Engine
    from ..config import ModelSpec, SamplingParams
    from ..policies.single import Single

    todo = [i for i, e in enumerate(examples) if e.get("response") is None]
    out = [dict(e) for e in examples]
    if not todo:
        return out
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    spec = ModelSpec(path=model, dtype=dtype)

    async def run():
        async with Engine(models={"writer": spec}, policy=Single("writer"), num_threads=num_threads) as engine:

            async def one(i):
                prompt = examples[i]["prompt"]
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                result = await engine.generate(messages, params)
                if result.finish_reason not in ("stop", "length") or not result.text:
                    raise ConfigError(
                        f"example {i}: the model wrote no response ({result.finish_reason}: {result.error})"
                    )
                out[i]["response"] = result.text

            async with anyio.create_task_group() as tg:
                for i in todo:
                    tg.start_soon(one, i)

    anyio.run(run)
    return out


# ---- labels -----------------------------------------------------------------------------------------
class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    path: str
    identity: ModelIdentity
    num_parameters: int = Field(ge=1)


class LabelsMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["tokenrouter-labels"] = FORMAT
    version: int = VERSION
    models: list[ModelEntry] = Field(min_length=1)
    num_examples: int = Field(ge=0)
    top_k: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    dtype: str = "float32"
    max_tokens_per_example: int | None = None
    source: str = ""
    summary: dict = Field(default_factory=dict)


@dataclass
class Labels:
    """One row per response token of the labelled examples (see the module docstring)."""

    model_names: list[str]
    model_paths: list[str]
    identities: list[ModelIdentity]
    num_parameters: list[int]
    greedy: torch.Tensor  # [N, M] int64: each model's greedy token
    entropy: torch.Tensor  # [N, M] float32: each model's normalized entropy
    sufficient: torch.Tensor  # [N] int64: smallest model index whose greedy token is the largest's
    token: torch.Tensor  # [N] int64: the reference token at this position
    hidden: torch.Tensor  # [N, H] float32: the small model's last hidden state
    token_embedding: torch.Tensor  # [N, H] float32: the small model's input embedding of its greedy token
    top_logprobs: torch.Tensor  # [N, K] float32: the small model's top-K log-probabilities, descending
    example: torch.Tensor  # [N] int64: example index
    position: torch.Tensor  # [N] int64: index of the token in the example's response
    num_examples: int
    dtype: str = "float32"
    max_tokens_per_example: int | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self._check()

    def __len__(self) -> int:
        return int(self.sufficient.shape[0])

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def top_k(self) -> int:
        return int(self.top_logprobs.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.hidden.shape[1])

    @property
    def hard(self) -> torch.Tensor:
        """[N] bool: the smallest model does not suffice."""
        return self.sufficient > 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in _TENSORS}

    def _check(self) -> None:
        m = len(self.model_names)
        if not (m == len(self.model_paths) == len(self.identities) == len(self.num_parameters)) or m < 2:
            raise ConfigError("labels: need two or more models, each with a name, path, identity and parameter count")
        n = int(self.sufficient.shape[0]) if self.sufficient.dim() == 1 else -1
        h = int(self.hidden.shape[-1]) if self.hidden.dim() == 2 else -1
        k = int(self.top_logprobs.shape[-1]) if self.top_logprobs.dim() == 2 else -1
        sizes = {"M": m, "H": h, "K": k}
        for name, (dtype, suffix) in _TENSORS.items():
            t = getattr(self, name)
            want = (n, *(sizes[s] for s in suffix))
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != want:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ConfigError(f"labels: tensor {name!r} should be {dtype} of shape {want}, got {got}")
        if n and (int(self.sufficient.min()) < 0 or int(self.sufficient.max()) >= m):
            raise ConfigError(f"labels: 'sufficient' must hold model indices in [0, {m})")
        if n and (int(self.example.min()) < 0 or int(self.example.max()) >= self.num_examples):
            raise ConfigError(f"labels: 'example' must hold example indices in [0, {self.num_examples})")

    # ---- files ---------------------------------------------------------------------------------------
    def meta(self) -> LabelsMeta:
        return LabelsMeta(
            models=[
                ModelEntry(name=n, path=p, identity=i, num_parameters=c)
                for n, p, i, c in zip(self.model_names, self.model_paths, self.identities, self.num_parameters)
            ],
            num_examples=self.num_examples,
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            dtype=self.dtype,
            max_tokens_per_example=self.max_tokens_per_example,
            source=self.source,
            summary=summary(self),
        )

    def save(self, directory: str | Path) -> Path:
        """Write `labels.safetensors` and `labels.json` into `directory` (created if needed)."""
        from safetensors.torch import save_file

        out = Path(directory)
        with atomic_path(out / LABELS_FILE) as tmp:
            save_file({k: v.contiguous() for k, v in self.tensors().items()}, tmp, metadata={"format": FORMAT})
        write_text_atomic(out / META_FILE, self.meta().model_dump_json(indent=2) + "\n")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Labels:
        """Read a directory written by `save`; every problem is a ConfigError naming the file."""
        path = Path(directory)
        meta, tensors, meta_path, tensors_path = read_saved(
            path, "labels", META_FILE, LABELS_FILE, LabelsMeta, "tokenrouter label"
        )
        if meta.version != VERSION:
            raise ConfigError(
                f"labels: {meta_path} has format version {meta.version}; this tokenrouter reads {VERSION}"
            )
        missing = sorted(set(_TENSORS) - set(tensors))
        if missing:
            raise ConfigError(f"labels: {tensors_path} lacks the tensors {missing}")
        try:
            labels = cls(
                model_names=[m.name for m in meta.models],
                model_paths=[m.path for m in meta.models],
                identities=[m.identity for m in meta.models],
                num_parameters=[m.num_parameters for m in meta.models],
                num_examples=meta.num_examples,
                dtype=meta.dtype,
                max_tokens_per_example=meta.max_tokens_per_example,
                source=meta.source,
                **{k: tensors[k] for k in _TENSORS},
            )
        except ConfigError as e:
            raise ConfigError(f"{e} (in {path})") from None
        if labels.top_k != meta.top_k or labels.hidden_size != meta.hidden_size:
            raise ConfigError(f"labels: {tensors_path} does not match {meta_path} (top-k or hidden size differ)")
        return labels


# ---- the summary -----------------------------------------------------------------------------------
def summary(labels: Labels) -> dict:
    """Examples and tokens; the share of tokens each model suffices for; and the share of the
    estimated FLOPs (2 x parameters per token, of the sufficient model) that the hardest 10% of
    tokens take (tokens sorted by sufficient model, largest first; ties in example, position
    order; ceil(10% of the tokens))."""
    n = len(labels)
    suff = labels.sufficient
    counts = torch.bincount(suff, minlength=labels.num_models).tolist() if n else [0] * labels.num_models
    flops = 2.0 * torch.tensor(labels.num_parameters, dtype=torch.float64)[suff] if n else torch.zeros(0)
    hardest = math.ceil(HARDEST_FRACTION * n)
    if n:
        # fixed order: sufficient descending, then example, then position (lexsort by stable sorts)
        order = torch.argsort(labels.position, stable=True)
        order = order[torch.argsort(labels.example[order], stable=True)]
        order = order[torch.argsort(suff[order], descending=True, stable=True)]
        share = float(flops[order[:hardest]].sum() / flops.sum())
    else:
        share = 0.0
    return {
        "examples": labels.num_examples,
        "tokens": n,
        "sufficient_share": {m: (c / n if n else 0.0) for m, c in zip(labels.model_names, counts)},
        "sufficient_tokens": dict(zip(labels.model_names, counts)),
        "hardest_fraction": HARDEST_FRACTION,
        "hardest_tokens": hardest,
        "hardest_flops_share": share,
        "flops_per_token": {m: 2 * p for m, p in zip(labels.model_names, labels.num_parameters)},
    }


# ---- labelling -------------------------------------------------------------------------------------
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
    from ..engine.model.loader import load_tokenizer

    return load_tokenizer(ModelSpec(path=path))


def _load_model(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from ..engine.model.loader import locate_checkpoint
    from ..errors import ModelLoadError

    directory, gguf = locate_checkpoint(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=dtype, local_files_only=True)
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
    from ..engine.model.runner import HiddenCapture

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
    examples = [_check_example(e, f"example {i}") for i, e in enumerate(examples)]
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


__all__ = ["Labels", "encode_example", "label", "python_corpus", "read_jsonl", "summary"]
