"""Tiny random models that load in milliseconds: real transformers models (Llama, Qwen2, Qwen3,
...) with random weights and a small byte-level BPE tokenizer trained here, saved as ordinary
Hugging Face directories."""

from __future__ import annotations

from pathlib import Path

import torch

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
    weight_std: float = 0.2,
    tokenizer=None,
    **config_overrides,
) -> Path:
    """Write a random-weight model and its tokenizer to `path`; return the path.

    `logit_scale` multiplies the output head: random weights give near-uniform next-token
    distributions, and a larger scale makes them peaked (low entropy) where tests need it.
    `weight_std`: the matrices' spread, wider than transformers' init so that the layers matter;
    at the default 0.2 attention is sharp enough that a last-bit difference upstream can move a
    layer's output by percents (tests comparing two ways of computing a model use less).
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
                p.normal_(0.0, weight_std)
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
