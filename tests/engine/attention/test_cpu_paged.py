"""The C attention kernel (engine/attention/cpu_paged.py): it computes what torch's SDPA does over
the paged cache, and a query's result is the same bits whatever else the step holds, however wide
its widest row is, and with any number of threads. At every CPU level this machine runs (plain C,
AVX2, AVX512), each built as the engine builds it for a CPU of that level."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tokenrouter.engine import AttentionMetadata, native
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.attention.cpu_paged import CpuPagedAttention
from tokenrouter.engine.attention.torch_paged import TorchPagedAttention
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.testing.paged_steps import step_metadata

BLOCK = 4
LEVELS = native.cpu.runnable()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, cpu_paged.Kernel]:
    """The kernel built for each level this CPU runs, lowest first."""
    if native.compiler() is None:
        pytest.skip("no C compiler")
    out = {}
    for level in LEVELS:
        path = native.build.build(cpu_paged.SOURCES, tmp_path_factory.mktemp(level), native.cpu.at(level))
        out[level] = cpu_paged.bind(ctypes.CDLL(str(path)), path)
    return out


@pytest.fixture(scope="module", params=LEVELS)
def kernel(request, kernels):
    got = kernels[request.param]
    assert got.level == request.param
    return got


def step(rows: list[tuple[int, int]], tables: list[list[int]]) -> AttentionMetadata:
    return step_metadata(rows, tables, BLOCK)


def tables_for(rows: list[tuple[int, int]], shuffle: torch.Generator) -> list[list[int]]:
    """Each row's blocks, scattered over the pool (block ids in random order)."""
    need = [-(-(c + n) // BLOCK) for c, n in rows]
    order = torch.randperm(sum(need), generator=shuffle).tolist()
    out, at = [], 0
    for k in need:
        out.append(order[at : at + k])
        at += k
    return out


def filled_cache(layout: KVLayout, blocks: int, gen: torch.Generator) -> KVCache:
    cache = KVCache(layout, blocks, BLOCK, torch.device("cpu"))
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    return cache


DTYPES16 = (torch.float16, torch.float32)  # a float16 cache, and the same values in float32

# (activations, KV cache): as a model computes, and float32 over llama.cpp's float16 KV
DTYPES = [
    pytest.param(torch.float32, torch.float32, id="float32"),
    pytest.param(torch.bfloat16, torch.bfloat16, id="bfloat16"),
    pytest.param(torch.float32, torch.float16, id="float32-kv-float16"),
]


@pytest.mark.parametrize("dtype, kv_dtype", DTYPES)
# (20, 2, 36): two passes of HEADS_AT_ONCE query heads (8, then 2), a head dim in no whole vectors
@pytest.mark.parametrize("heads, kv_heads, dim", [(12, 2, 128), (4, 4, 16), (9, 3, 64), (6, 1, 20), (20, 2, 36)])
@pytest.mark.parametrize("window", [None, 7])
def test_the_kernel_computes_what_torchs_attention_does(kernel, dtype, kv_dtype, heads, kv_heads, dim, window):
    gen = torch.Generator().manual_seed(heads * 100 + dim)
    rows = [(37, 1), (5, 1), (12, 3), (0, 9), (20, 40), (0, 1)]  # decodes, a short extend, prefills
    tables = tables_for(rows, gen)
    layout = KVLayout(1, kv_heads, dim, kv_dtype)
    cache = filled_cache(layout, 64, gen)
    meta = step(rows, tables)
    tokens = meta.slot_mapping.numel()
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    want = TorchPagedAttention(cache).forward(0, q, k, v, meta, dim**-0.5, window)
    got = CpuPagedAttention(cache, kernel).forward(0, q, k, v, meta, dim**-0.5, window)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype, kv_dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 21])
def test_every_level_computes_what_the_highest_does(kernels, dtype, kv_dtype, window):
    """The levels sum in their own orders (paged.h): the last bits differ, never more than the
    tolerance torch's attention is held to."""
    if len(kernels) < 2:
        pytest.skip("this CPU runs one level")
    gen = torch.Generator().manual_seed(7)
    heads, kv_heads, dim = 12, 2, 100
    rows = [(300, 1), (45, 1), (17, 5), (0, 70)]
    layout = KVLayout(1, kv_heads, dim, kv_dtype)
    cache = filled_cache(layout, 128, gen)
    meta = step(rows, tables_for(rows, gen))
    tokens = meta.slot_mapping.numel()
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    *lower, highest = kernels.values()
    want = CpuPagedAttention(cache, highest).forward(0, q, k, v, meta, dim**-0.5, window)
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    for kernel in lower:
        got = CpuPagedAttention(cache, kernel).forward(0, q, k, v, meta, dim**-0.5, window)
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol, msg=lambda m: f"{kernel.level}: {m}")


@pytest.mark.parametrize("dtype, kv_dtype", DTYPES)
# (8, 4, 40): 2 query heads a KV head, which the vector levels take several keys and vectors a pass
@pytest.mark.parametrize(
    "n, positions, heads, kv_heads, dim",
    [
        (70, [0, 15, 16, 43, 47, 48, 69], 12, 2, 128),
        (600, [1, 255, 256, 300, 511, 512, 599], 12, 2, 128),
        (70, [0, 2, 3, 30, 33, 69], 8, 4, 40),
    ],
)
def test_a_query_is_the_same_bits_in_any_step(kernel, dtype, kv_dtype, n, positions, heads, kv_heads, dim):
    """One row of n tokens: prefilled whole, then each token again as a decode row beside rows
    of other widths (up to 1100 keys), as the last of a verifier's 5 checked tokens, and with one
    or two threads. (torch's SDPA fails this at 600 tokens in float32: a prefill's token and the
    same token decoded differ.)"""
    gen = torch.Generator().manual_seed(n)
    layout = KVLayout(1, kv_heads, dim, kv_dtype)
    cache = filled_cache(layout, 1200, gen)
    q = torch.randn(n, heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(n, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    table = list(range(1199, 1199 - -(-n // BLOCK), -1))  # its blocks in reverse order
    others = [list(range(i * 280, i * 280 + 280)) for i in range(3)]  # rows beside it, up to 1120 keys
    beside = [(1100, 1), (3, 1), (n // 2, 1)]
    backend = CpuPagedAttention(cache, kernel)
    whole = backend.forward(0, q, k, v, step([(0, n)], [table]), dim**-0.5, None)
    threads = torch.get_num_threads()

    def last_row(rows, tables, own):  # the output of the last row's last token, random rows before it
        extra = sum(r[1] for r in rows[:-1])
        qs = torch.cat([torch.randn(extra, heads, dim, generator=gen).to(dtype), q[own]])
        ks = torch.cat([torch.randn(extra, kv_heads, dim, generator=gen).to(dtype), k[own]])
        vs = torch.cat([torch.randn(extra, kv_heads, dim, generator=gen).to(dtype), v[own]])
        return backend.forward(0, qs, ks, vs, step(rows, tables), dim**-0.5, None)[-1]

    try:
        for t, pos in enumerate(positions):
            torch.set_num_threads(1 + t % 2)
            decoded = last_row([*beside[: t % 4], (pos, 1)], [*others[: t % 4], table], slice(pos, pos + 1))
            assert torch.equal(decoded, whole[pos]), (dtype, pos, "decode")
            first = max(0, pos - 4)
            rows = [*beside[: t % 3], (first, pos + 1 - first)]
            checked = last_row(rows, [*others[: t % 3], table], slice(first, pos + 1))
            assert torch.equal(checked, whole[pos]), (dtype, pos, "check")
    finally:
        torch.set_num_threads(threads)


# 64: whole vectors; 20: a padded tail (the plain level widens float32 rows of it too)
@pytest.mark.parametrize("dim", [64, 20])
def test_a_float16_cache_is_the_same_bits_as_its_values_in_float32(kernel, dim):
    """float16 K/V widen to float32 exactly, zeros and subnormals too (the plain level widens rows
    that hold them apart from the others): a float32 cache of the same values gives the same bits."""
    gen = torch.Generator().manual_seed(dim)
    rows = [(45, 1), (0, 9)]
    meta = step(rows, tables_for(rows, gen))
    tokens, heads, kv_heads = meta.slot_mapping.numel(), 4, 2

    def halves(*shape):  # float16 values, zeros and subnormals in some rows of K and V, not all
        x = torch.randn(*shape, generator=gen).to(torch.float16).flatten()
        x[::97] = 0.0
        x[1::89] = (torch.randn(x[1::89].shape, generator=gen) * 3e-6).to(torch.float16)
        return x.view(shape)

    assert (halves(1000).abs() < 6.1e-5).any()  # subnormal float16: below 2^-14
    caches = [KVCache(KVLayout(1, kv_heads, dim, dtype), 32, BLOCK, torch.device("cpu")) for dtype in DTYPES16]
    for i in range(2):
        values = halves(*caches[0].k[0].shape)
        for cache in caches:
            (cache.k if i == 0 else cache.v)[0].copy_(values)
    q = torch.randn(tokens, heads, dim, generator=gen)
    k, v = halves(tokens, kv_heads, dim).float(), halves(tokens, kv_heads, dim).float()
    f16, f32 = (CpuPagedAttention(c, kernel).forward(0, q, k, v, meta, dim**-0.5, None) for c in caches)
    assert torch.equal(f16, f32)


@pytest.mark.parametrize(
    "tables, why",
    [([[0]], "7 keys in one block of 4"), ([[99, 1]], "a block past the cache"), ([[1, -1]], "a negative block")],
)
def test_a_step_that_would_read_outside_the_cache_is_refused(kernel, tables, why):
    layout = KVLayout(1, 2, 16, torch.float32)
    cache = filled_cache(layout, 8, torch.Generator().manual_seed(0))
    meta = step([(6, 1)], [[0, 1]])
    meta.block_tables = tables
    q, k, v = torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
    with pytest.raises(RuntimeError, match="tr_paged_attention failed"):
        CpuPagedAttention(cache, kernel).forward(0, q, k, v, meta, 0.25, None)
