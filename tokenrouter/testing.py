"""Helpers for testing code that uses tokenrouter.

- Tiny random models that load in milliseconds: real transformers models (Llama, Qwen2, Qwen3,
  ...) with random weights and a small byte-level BPE tokenizer trained here, saved as ordinary
  Hugging Face directories.
- `reference_generate`: a policy run the slow, obvious way, one request at a time, to check the
  engine (or your own policy) against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import SamplingParams
from .policies.base import Policy

# ChatML, and tools in the Hermes format Qwen2.5's template uses (a system block listing them, calls
# in <tool_call> blocks; results are plain "tool" messages), so the tiny models run tool calls too.
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions. Their signatures are within <tools></tools>:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each call, return a JSON object with the function name and arguments within <tool_call></tool_call>:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and tools and loop.first %}"
    "{% elif m['role'] == 'assistant' and m['tool_calls'] is defined and m['tool_calls'] %}<|im_start|>assistant\n"
    "{% if m['content'] %}{{ m['content'] }}\n{% endif %}"
    "{% for c in m['tool_calls'] %}<tool_call>\n"
    "{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. Token-level routing lets a small model write the
easy tokens while a large model writes the hard ones. def add(a, b): return a + b
Ünïcödé text, émojis 🙂🚀 and CJK 你好世界 must survive incremental detokenization.
for i in range(10): print(i * i)  # squares; numbers 0123456789 and symbols {}[]()<>=+-*/
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int = 384):
    """A byte-level BPE tokenizer (every string encodes) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(arch: str, vocab_size: int, **overrides):
    """A small config of the given family: 'llama', 'qwen2' or 'qwen3' (or any transformers model_type)."""
    from transformers import AutoConfig

    kwargs = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    if arch == "qwen3":
        kwargs["head_dim"] = 16
    kwargs.update(overrides)
    return AutoConfig.for_model(arch, **kwargs)


def build_tiny_model(
    path: str | Path,
    arch: str = "qwen2",
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    logit_scale: float = 1.0,
    tokenizer=None,
    **config_overrides,
) -> Path:
    """Write a random-weight model and its tokenizer to `path`; return the path.

    `logit_scale` multiplies the output head: random weights give near-uniform next-token
    distributions, and a larger scale makes them peaked (low entropy) where tests need it.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = Path(path)
    tokenizer = tokenizer or build_tokenizer()
    config = tiny_config(arch, len(tokenizer), **config_overrides)
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():  # wider than the default init, so the layers matter
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_pair(
    root: str | Path, *, dtype: torch.dtype = torch.float64, tokenizer=None, **config_overrides
) -> dict[str, Path]:
    """The tiny routing pair under `root`: {"small": dir, "large": dir}, two random Qwen2 models
    sharing one tokenizer, the large one deeper and wider. With logit_scale=3 their normalized
    entropies straddle 0.2 both ways often, so RStitch(0.2) hands off in both directions."""
    root = Path(root)
    tokenizer = tokenizer or build_tokenizer()
    kw = dict(dtype=dtype, tokenizer=tokenizer, logit_scale=3.0, **config_overrides)
    return {
        "small": build_tiny_model(root / "small", "qwen2", seed=1, **kw),
        "large": build_tiny_model(root / "large", "qwen2", seed=2, num_hidden_layers=3, hidden_size=96, **kw),
    }


def build_perturbed_copy(source: str | Path, path: str | Path, *, noise: float = 0.05, seed: int = 0) -> Path:
    """Write a copy of the model at `source` with Gaussian noise (std `noise`) added to every
    weight matrix; return the path. Two random models never agree on a token; a perturbed copy
    agrees with its source most of the time, as a distilled drafter does with its target, so
    verifying policies accept some drafts and reject others."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * noise)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return Path(path)


@dataclass
class ReferenceOutput:
    token_ids: list[int]
    token_models: list[str]
    num_handoffs: int
    finish_reason: str
    # per model, the sequence length at its last forward: what an engine that never recomputes
    # feeds that model for this request (prompt + every token it had not yet seen)
    context_at_last_step: dict[str, int]


def load_reference_models(paths: Mapping[str, str | Path], dtype: torch.dtype = torch.float32) -> dict:
    """Plain transformers models (eager attention, no engine involved) for `reference_generate`."""
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
        for name, path in paths.items()
    }


def _eos_of(model) -> frozenset[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


@torch.no_grad()
def reference_generate(
    policy: Policy,
    models: Mapping[str, torch.nn.Module],
    prompt_ids: list[int],
    params: SamplingParams,
    max_model_len: int | None = None,
) -> ReferenceOutput:
    """Run one request under a policy the slow, obvious way, to check an engine (or a policy) against.

    Every step recomputes the whole sequence with a plain transformers forward on the model that
    owns the request: no KV cache, no batching, no threads. The policy's `route`, `send` and
    `receive` are applied exactly as the engine applies them, and sampling uses the engine's
    sampler, so seeded sampling matches too. Penalties are applied to every position's logits
    from the tokens before it (sampling/penalties.py), before the policy sees them. EOS comes from
    each model's generation_config.

    A verifying policy (VERIFY) runs as policies/base.py describes it: the drafters' tokens are
    tentative (a drafter hands the request to the verifier where it would end, or after
    `max_draft`), and on the verifier's turn `verify` judges them from one forward's logits, the
    accepted ones count as their drafter's, the rest are dropped, and the verifier writes the
    next position.
    """
    from .engine.handoff import MAX_STALLS
    from .engine.model.runner import HiddenCapture
    from .policies.base import (
        ENTROPY,
        HIDDEN,
        TOKEN_EMBEDDING,
        PeerMessage,
        StepResult,
        VerifyResult,
        normalized_entropy,
    )
    from .sampling.penalties import penalize_rows
    from .sampling.sampler import Sampler, SamplingTensors

    names = policy.models
    tokens = list(prompt_ids)
    written: list[str] = []
    states: dict[str, dict] = {name: {} for name in names}
    known: dict[tuple[str, str], int] = {}  # (holder, peer) -> tokens the peer knows
    current = policy.entry_model
    max_tokens = params.max_tokens
    if max_model_len is not None:
        max_tokens = min(max_tokens, max_model_len - len(prompt_ids))
    seed = params.seed if params.seed is not None else 0
    sampler = Sampler()
    handoffs = stalls = 0
    last: dict[str, int] = {}

    def done(reason: str) -> ReferenceOutput:
        return ReferenceOutput(tokens[len(prompt_ids) :], written, handoffs, reason, last)

    verifier = policy.verifier
    confirmed = len(prompt_ids)  # tokens before this are confirmed; later ones are a drafter's, tentative
    drafter: str | None = None

    def sample(row: torch.Tensor, generated: int) -> torch.Tensor:
        if params.temperature == 0.0:
            return row.argmax(dim=-1)
        return sampler(row, SamplingTensors.build([params], [seed], [generated], row.device))

    def processed(rows: torch.Tensor, first: int) -> torch.Tensor:
        """Row j predicts the position after the first `first + j` tokens."""
        if not params.penalized:
            return rows
        lengths = [first + j for j in range(rows.shape[0])]
        n = len(lengths)
        return penalize_rows(rows, [tokens] * n, [len(prompt_ids)] * n, lengths, [params] * n)

    def ends_at(t: int, model) -> bool:
        return (t in _eos_of(model) and not params.ignore_eos) or t in params.stop_token_ids

    captures = {name: HiddenCapture(m) for name, m in models.items()} if HIDDEN in policy.requires else {}
    try:
        while True:
            model = models[current]
            last[current] = len(tokens)
            if current == verifier and len(tokens) > confirmed:  # a check: judge the drafts first
                span = processed(model(torch.tensor([tokens])).logits[0, confirmed - 1 :], confirmed)
                drafts = tokens[confirmed:]
                verdict = policy.verify(
                    VerifyResult(
                        model=current,
                        model_index=names.index(current),
                        request_ids=["reference"],
                        sources=[drafter],
                        start=torch.tensor([confirmed]),
                        num_drafts=torch.tensor([len(drafts)]),
                        drafts=torch.tensor([drafts]),
                        logits=span[None],
                        num_generated=torch.tensor([confirmed - len(prompt_ids)]),
                        states=[states[current]],
                        params=[params],
                        seeds=[seed],
                    )
                )
                accept = int(verdict.accept[0])
                for j, t in enumerate(drafts[:accept]):
                    written.append(drafter)
                    if ends_at(t, models[drafter]) or confirmed + j + 1 - len(prompt_ids) >= max_tokens:
                        del tokens[confirmed + j + 1 :]
                        return done("stop" if ends_at(t, models[drafter]) else "length")
                del tokens[confirmed + accept :]
                confirmed = len(tokens)
                logits = span[accept : accept + 1]
                given = -1 if verdict.tokens is None else int(verdict.tokens[0])
                token = torch.tensor([given]) if given >= 0 else sample(logits, len(tokens) - len(prompt_ids))
                hidden = None
            else:
                logits = processed(model(torch.tensor([tokens])).logits[0, -1:], len(tokens))
                hidden = captures[current].take()[0, -1:] if captures else None
                token = sample(logits, len(tokens) - len(prompt_ids))
            generated = len(tokens) - len(prompt_ids)
            keep, nxt = True, names.index(current)
            drafting = verifier is not None and current != verifier
            if len(names) > 1:
                result = StepResult(
                    model=current,
                    model_index=names.index(current),
                    request_ids=["reference"],
                    tokens=token,
                    logits=logits,
                    num_generated=torch.tensor([generated]),
                    states=[states[current]],
                    entropy=normalized_entropy(logits) if ENTROPY in policy.requires else None,
                    hidden=hidden,
                    token_embedding=model.get_input_embeddings()(token) if TOKEN_EMBEDDING in policy.requires else None,
                    params=[params],
                    seeds=[seed],
                    tentative=torch.tensor([len(tokens) + 1 - confirmed]) if drafting else None,
                )
                decision = policy.route(result)
                keep, nxt = bool(decision.keep[0]), int(decision.next_model[0])
            if keep:
                t = int(token[0])
                tokens.append(t)
                stalls = 0
                if drafting:  # tentative: where it would end, or after max_draft, the verifier decides
                    drafter = current
                    full = len(tokens) - len(prompt_ids) >= max_tokens
                    if ends_at(t, model) or full or len(tokens) - confirmed >= policy.max_draft:
                        nxt = names.index(verifier)
                else:
                    written.append(current)
                    confirmed = len(tokens)
                    if ends_at(t, model):
                        return done("stop")
                    if len(tokens) - len(prompt_ids) >= max_tokens:
                        return done("length")
            target = names[nxt]
            if target == current:
                if not keep:
                    raise RuntimeError("policy discarded a token without handing the request off")
                continue
            stalls += 0 if keep else 1
            if stalls > MAX_STALLS:
                raise RuntimeError("policy handed the request off repeatedly without a token")
            start = min(known.get((current, target), 0), len(tokens))
            msg = PeerMessage("reference", current, target, tokens[start:], start=start, confirmed=confirmed)
            msg = policy.send(msg, states[current])
            policy.receive(msg, states[target])
            known[(current, target)] = known[(target, current)] = len(tokens)
            handoffs += 1
            current = target
    finally:
        for capture in captures.values():  # leave the caller's models without our hooks
            capture.remove()
