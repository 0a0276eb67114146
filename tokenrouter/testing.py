"""Helpers for testing code that uses tokenrouter: tiny random models that load in milliseconds.

A tiny model is a real transformers model (Llama, Qwen2, Qwen3, ...) with random weights and a
small byte-level BPE tokenizer trained here, saved as an ordinary Hugging Face directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
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

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
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
