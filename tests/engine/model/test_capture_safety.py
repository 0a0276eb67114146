"""Capture safety, checked on a CPU: the decode forward a CUDA graph records must neither sync
with the host nor make tensors from Python data.

A CUDA graph records the kernels a forward launches, not its Python. A host sync inside it
(`.item()`, `nonzero`, a copy to the host) fails the capture or, worse, freezes a value read
once into every replay; a tensor made from Python data inside it is uploaded once and replayed
stale. The real capture needs a GPU; here the same forward runs on the stand-in accelerator
(tokenrouter/testing/accelerator.py), which counts both, with a real tiny transformers model
and flashinfer's contract fake (tokenrouter/testing/flashinfer_fake.py) in capture mode (which
refuses a `plan()` and any wrapper not built for graphs).
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from tokenrouter import ModelSpec
from tokenrouter.engine.attention import FlashInferPagedAttention, flashinfer_paged
from tokenrouter.engine.attention.torch_paged import TorchPagedAttention
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.engine.model import ModelRunner, load_model
from tokenrouter.engine.model.cuda_graph import scratch_decode
from tokenrouter.testing.accelerator import StandInAccelerator
from tokenrouter.testing.flashinfer_fake import FakeFlashInfer

BS = 4
BLOCKS = 16  # the last one is the scratch block the padded rows use


@dataclasses.dataclass
class GraphStep:
    accel: StandInAccelerator
    lib: FakeFlashInfer
    runner: ModelRunner
    backend: FlashInferPagedAttention


@pytest.fixture
def graph_step(tiny_model, monkeypatch):
    """A bfloat16 tiny Qwen2 and its paged cache on the stand-in accelerator, served by the
    flashinfer backend over the contract fake, as a CUDA worker sets them up."""
    lib = FakeFlashInfer(check_values=False)  # its value checks read the host: not the forward's
    monkeypatch.setattr(flashinfer_paged, "import_flashinfer", lambda: lib)
    accel = StandInAccelerator()
    with accel:
        # plain nn.Linear, as on a GPU (not the CPU's packed oneDNN kernels)
        loaded = load_model("m", ModelSpec(path=tiny_model, dtype="bfloat16", onednn_linear=False))
        loaded.model.to(accel.device)
        loaded = dataclasses.replace(loaded, device=accel.device)
        layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
        cache = KVCache(layout, BLOCKS, BS, accel.device)
        backend = FlashInferPagedAttention(cache, loaded.model.config.num_attention_heads, accel.device)
        yield GraphStep(accel, lib, ModelRunner(loaded, backend, BS), backend)


def captured_forward(step: GraphStep, size: int):
    """What DecodeGraphs.capture records for `size` rows: planned into the graph's buffers and
    warmed up outside, then the forward alone, counted. Returns (logits on the host, syncs)."""
    ids, pos, meta = scratch_decode(size, BLOCKS - 1, BS, step.accel.device)
    step.backend.use_graph(size, max_pages_per_row=4)
    try:
        step.backend.plan(meta)
        step.runner.run_model(ids, pos, meta, 0)  # the warm-up: plans every layer kind
        with step.lib.capture(), step.accel.syncs() as syncs:
            logits, _ = step.runner.run_model(ids, pos, meta, 0)
    finally:
        step.backend.use_graph(None)
    return step.accel.peek(logits), syncs


@pytest.mark.parametrize("size", [1, 4])
def test_the_decode_forward_is_capture_safe(graph_step, tiny_model, size):
    logits, syncs = captured_forward(graph_step, size)
    assert syncs.total == 0, f"the captured forward syncs with the host: {syncs.log}"
    assert graph_step.accel.holds(graph_step.runner.model.lm_head.weight)
    # the same step on the host, eagerly, with torch's backend: the same logits
    loaded = load_model("m", ModelSpec(path=tiny_model, dtype="bfloat16", onednn_linear=False))
    cache = KVCache(KVLayout.from_config(loaded.model.config, loaded.dtype), BLOCKS, BS, "cpu")
    host = ModelRunner(loaded, TorchPagedAttention(cache), BS)
    ids, pos, meta = scratch_decode(size, BLOCKS - 1, BS, torch.device("cpu"))
    host.backend.plan(meta)
    expected, _ = host.run_model(ids, pos, meta, 0)
    assert logits.shape == expected.shape == (size, loaded.vocab_size) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=2e-2, atol=2e-2)


@contextlib.contextmanager
def hooked(module: torch.nn.Module, hook):
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize(
    "defect, kind",
    [
        (lambda out: out.sum().item(), "read"),  # a scalar read: _local_scalar_dense
        (lambda out: out[0, 0].nonzero(), "read"),  # a data-dependent size
        (lambda out: torch.tensor([1.0, 2.0], device=out.device), "upload"),  # Python data in the forward
    ],
)
def test_the_check_sees_what_would_break_a_capture(graph_step, defect, kind):
    """The same forward with one defect in a layer: the check names it."""
    layer = graph_step.runner.model.model.layers[0].mlp

    def hook(module, args, out):
        defect(out)

    with hooked(layer, hook):
        _, syncs = captured_forward(graph_step, 2)
    assert syncs.total == 1 and syncs.log[0].startswith(kind), syncs.log


def test_a_plan_inside_the_capture_is_refused(graph_step):
    """A layer kind first seen inside a capture would plan there: the fake refuses, as a capture would fail."""
    step = graph_step
    ids, pos, meta = scratch_decode(2, BLOCKS - 1, BS, step.accel.device)
    step.backend.use_graph(2, max_pages_per_row=4)
    try:
        step.backend.plan(meta)
        with step.lib.capture(), pytest.raises(RuntimeError, match="plan"):
            step.runner.run_model(ids, pos, meta, 0)  # no warm-up: the layer kind is planned lazily
    finally:
        step.backend.use_graph(None)
