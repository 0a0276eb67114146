"""Helpers for testing code that uses tokenrouter.

- `tiny_models`: tiny random models that load in milliseconds, and their tokenizer.
- `reference`: `reference_generate`, a policy run the slow, obvious way, to check an engine against.
- `engine_parts`, `faults`: what a running engine lends to tests; a model's forward failed, its scheduler broken.
- `worker_state`: what a model's worker holds (requests, KV blocks, hand-offs in its inbox).
- `gguf`: a tiny model's weights as a GGUF file, quantized as llama.cpp does (Q4_K, Q8_0).
- `accelerator`: `StandInAccelerator`, a CPU device that checks placement and counts syncs as CUDA would.
- `flashinfer_fake`: `FakeFlashInfer`, flashinfer 0.7.4's contract in plain torch, for the GPU path on CPU.
- `paged_steps`: a step's attention metadata made by hand, to check or time an attention backend.
"""

from .engine_parts import lend, loaded_model, requests_in_flight, take_back, workers_of
from .faults import break_scheduler, fail_forward, wrap_forward
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
from .worker_state import (
    captures_hidden_states,
    handoff_waiting,
    kv_blocks_in_use,
    kv_blocks_total,
    live_sequences,
    scheduler_queues,
)

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "build_perturbed_copy", "build_tiny_model", "build_tiny_pair"]
__all__ += ["build_tokenizer", "tiny_config", "ReferenceOutput", "load_reference_models", "reference_generate"]
__all__ += ["quantize_q4k", "write_gguf", "break_scheduler", "fail_forward", "wrap_forward", "handoff_waiting"]
__all__ += ["kv_blocks_in_use", "kv_blocks_total", "live_sequences", "scheduler_queues", "captures_hidden_states"]
__all__ += ["lend", "loaded_model", "requests_in_flight", "take_back", "workers_of"]
