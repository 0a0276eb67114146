"""Helpers for testing code that uses tokenrouter.

- `tiny_models`: tiny random models that load in milliseconds, and their tokenizer.
- `reference`: `reference_generate`, a policy run the slow, obvious way, to check an engine (or
  your own policy) against.
- `gguf`: a GGUF file of a tiny model's weights, quantized as llama.cpp does (Q4_K, Q8_0), for the
  engine's GGUF mode.
- `accelerator`: `StandInAccelerator`, a device that holds CPU data but raises on host/device
  mixes and counts host syncs, as CUDA would: device placement checked on a CPU-only torch.
- `flashinfer_fake`: `FakeFlashInfer`, flashinfer 0.7.4's contract (signatures, the checks its
  wrappers make, the attention they compute) in plain torch, for the GPU path's logic on CPU.
- `paged_steps`: a step's attention metadata made by hand, to check or time an attention backend.
"""

from .gguf import quantize_q4k, write_gguf
from .reference import ReferenceOutput, load_reference_models, reference_generate
from .tiny_models import (
    CHATML_TEMPLATE,
    SPECIAL_TOKENS,
    build_perturbed_copy,
    build_tiny_model,
    build_tiny_pair,
    build_tokenizer,
    tiny_config,
)

__all__ = [
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
    "ReferenceOutput",
    "build_perturbed_copy",
    "build_tiny_model",
    "build_tiny_pair",
    "build_tokenizer",
    "load_reference_models",
    "quantize_q4k",
    "reference_generate",
    "tiny_config",
    "write_gguf",
]
