"""The flashinfer modules our kernels need, as JIT specs: those the trimmed wheel keeps the sources of
(`probe_specs`) and those the jit stages build on the GPU (`warm_specs`). flashinfer is imported inside the
functions: the kit's other commands run before it is installed."""

from __future__ import annotations

# The attention kernels tokenrouter's flashinfer backend asks for (engine/attention/flashinfer_paged.py): bfloat16
# queries and pages, int32 indices, no positional encoding in the kernel, no logit soft cap. (head_dim,
# sliding window) of the models the kit runs: the gpu tests' pair (64, with and without a window) and the
# demo pair's shapes (small 64, large 128, no window). Decode runs on tensor cores (GQA groups >= 4; bf16
# decode then always takes FA2's prefill module, flashinfer/decode.py). Prefill, under flashinfer 0.7.4's
# rule (BatchPrefillWithPagedKVCacheWrapper._determine_auto_backend): FA3 on Hopper, except that a step whose
# longest query row is 64 tokens or fewer runs FA2. The gpu tests' windowed step has rows of at most 5 tokens,
# and the demo pair has no window: FA3 with a window never runs, so it is not built. Stage jit-fa2 builds
# WARM_FA2 (decode and short prefill rows; without it the run falls back to torch), then jit-fa3 WARM_FA3
# (rows over 64 tokens: the engine's load-time self-test, the benchmarks' prompts; without it prefill is
# forced to FA2, prefill_backend="fa2", and FA3 is never asked for).
WARM_FA2 = [(64, False), (64, True), (128, False)]
WARM_FA3 = [(64, False), (128, False)]


def probe_specs():
    """Every module whose sources the trimmed wheel keeps: the warm set, plus the FA2 variants flashinfer may
    pick instead (runtime and independent strides) and the CUDA-core decode kernel (GQA groups under 4)."""
    import flashinfer.jit.attention.modules
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.page import gen_page_module

    # the FA2 variants' generators have no public name (allowed in tests/test_layering.py)
    primary = flashinfer.jit.attention.modules._gen_batch_prefill_primary_module
    independent_paged = flashinfer.jit.attention.modules._gen_batch_prefill_independent_paged_module
    independent_full = flashinfer.jit.attention.modules._gen_batch_prefill_independent_full_module
    bf = torch.bfloat16
    specs = [gen_page_module()]
    for head_dim in (64, 128):
        for window in (False, True):
            a = (bf, bf, bf, torch.int32, head_dim, head_dim, 0, window, False, False)
            specs += [
                primary("fa2", *a),
                gen_batch_prefill_module("fa2", *a),
                independent_paged("fa2", *a),
                independent_full("fa2", *a),
                gen_batch_prefill_module("fa3", *a),
                gen_batch_decode_module(*a[:-1]),
            ]
    return specs


def warm_specs(part: str, device=None, prefill_backend: str | None = None):
    """The modules the engine builds on this device, by part. "fa2": the page append and FA2's module for
    each of WARM_FA2 (tensor-core decode, prefill rows of 64 tokens or fewer, all prefill off Hopper). "fa3":
    FA3's module for each of WARM_FA3 where flashinfer picks FA3 for `device` (Hopper); without a device,
    `prefill_backend` says whether it does (the CPU probe: "fa3", the H200's)."""
    import flashinfer.jit.attention.modules
    import torch
    from flashinfer.jit.attention.modules import gen_batch_prefill_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.utils import determine_attention_backend

    primary = flashinfer.jit.attention.modules._gen_batch_prefill_primary_module  # no public name

    bf = torch.bfloat16

    def args(head_dim, window):
        return (bf, bf, bf, torch.int32, head_dim, head_dim, 0, window, False, False)

    if part == "fa2":
        return [gen_page_module()] + [primary("fa2", *args(*c)) for c in WARM_FA2]
    if part != "fa3":
        raise ValueError(f"part is fa2 or fa3, not {part!r}")
    specs = []
    for head_dim, window in WARM_FA3:
        backend = prefill_backend
        if device is not None:
            backend = determine_attention_backend(
                device, 0, False, False, bf, bf, head_dim_qk=head_dim, head_dim_vo=head_dim
            )
        if backend == "fa3":
            specs.append(gen_batch_prefill_module("fa3", *args(head_dim, window)))
    return specs
