"""The C kernels built without OpenMP (native/parallel.h's POSIX threads: how a Mac's Apple clang
builds them, and what `build(..., openmp=False)` or TOKENROUTER_OPENMP=0 builds anywhere) compute
the OpenMP build's bits at any thread count: each row is the same code, computed whole by one
thread, split over the threads as OpenMP's static schedule splits it.

Here at the machine's own level; `TOKENROUTER_OPENMP=0 pytest tests/engine/quant/test_gguf_blocks.py
tests/engine/attention/test_cpu_paged.py` runs the kernels' own tests on such builds at every level.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenrouter import store
from tokenrouter.engine import native
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.attention.cpu_paged import CpuPagedAttention
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.engine.quant import gguf_native
from tokenrouter.engine.quant.gguf_blocks import GGUFBlockLinear
from tokenrouter.engine.quant.gguf_fused import FusedLinears
from tokenrouter.testing.paged_steps import step_metadata

from .quant.test_gguf_blocks import random_blocks

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler")

LEVEL = native.cpu.runnable()[-1]  # the machine's own
WAYS = ("openmp", "pthreads")
THREADS = [1, 2, 3, 5]  # 5: more threads than this machine's cores, shares of unequal length


def _both(sources) -> dict[str, Path]:
    """ "openmp" and "pthreads": `sources` built both ways into the store, side by side (the
    engine's own build at this level, and one more entry: each built once, as the engine's are)."""
    folder = store.home_dir() / "kernels"
    paths = {way: native.build.build(sources, folder, native.cpu.at(LEVEL), openmp=way == "openmp") for way in WAYS}
    assert "-pthreads-" in paths["pthreads"].name and "-pthreads-" not in paths["openmp"].name
    assert all(p.is_file() for p in paths.values())  # neither build replaced the other
    return paths


@pytest.fixture(scope="module")
def gguf_libs() -> dict[str, gguf_native.Library]:
    return {way: gguf_native.bind(ctypes.CDLL(str(p)), p) for way, p in _both(gguf_native.SOURCES).items()}


@pytest.fixture(scope="module")
def attention_kernels() -> dict[str, cpu_paged.Kernel]:
    return {way: cpu_paged.bind(ctypes.CDLL(str(p)), p) for way, p in _both(cpu_paged.SOURCES).items()}


@pytest.fixture(params=THREADS, ids=[f"threads-{n}" for n in THREADS])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF dependencies")
def test_the_pthreads_build_needs_no_openmp_runtime(gguf_libs, attention_kernels):
    for libs in (gguf_libs, attention_kernels):
        assert b"libgomp" in libs["openmp"].path.read_bytes()
        assert (
            b"libgomp" not in libs["pthreads"].path.read_bytes() and b"GOMP_" not in libs["pthreads"].path.read_bytes()
        )


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_the_gguf_kernels_compute_the_openmp_builds_bits(gguf_libs, kind, threads):
    n, k = 83, 512  # 6 groups of 16 rows: 2 threads take 3 each, 5 take 2, 1, 1, 1, 1
    blocks = random_blocks(kind, n, k, seed=3)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(4))  # 7 rows: x's rounding in parallel too
    bias = torch.randn(n)
    got = {}
    for name, lib in gguf_libs.items():
        packed = gguf_native.repack(lib, kind, blocks, (n, k))
        got[name] = (
            packed,
            gguf_native.matmul(lib, kind, blocks, (n, k), x, bias),
            gguf_native.matmul(lib, kind, packed, (n, k), x, bias, packed=True),
            gguf_native.matmul(lib, kind, packed, (n, k), x[:1].to(torch.bfloat16), bias, packed=True),
        )
    for want, have in zip(got["openmp"], got["pthreads"], strict=True):
        assert torch.equal(want, have)


def test_the_fused_linears_compute_the_openmp_builds_bits(gguf_libs, threads):
    k, gen = 256, torch.Generator().manual_seed(5)
    x, norm = torch.randn(5, k, generator=gen), torch.rand(k, generator=gen) + 0.5
    out = {}
    for name, lib in gguf_libs.items():
        q, kk, v = (GGUFBlockLinear(lib, "Q4_K", random_blocks("Q4_K", n, k, seed=n), (n, k)) for n in (64, 16, 16))
        gate, up = (GGUFBlockLinear(lib, "Q6_K", random_blocks("Q6_K", 48, k, seed=s), (48, k)) for s in (6, 7))
        qkv = FusedLinears([q, kk, v], "store", norm, 1e-6)(x)
        mlp = FusedLinears([gate, up], "silu_mul", norm, 1e-6)(x)
        residual = x[:, :64].clone()
        FusedLinears([q], "add")(x, residual)
        out[name] = (qkv, mlp, residual)
    for want, have in zip(out["openmp"], out["pthreads"], strict=True):
        assert torch.equal(want, have)


def _attention(kernels: dict[str, cpu_paged.Kernel], dtype: torch.dtype, kv_dtype: torch.dtype, window=None) -> dict:
    gen = torch.Generator().manual_seed(8)
    heads, kv_heads, dim, block = 12, 2, 64, 4
    rows = [(90, 1), (13, 1), (7, 6), (0, 20)]  # decode rows and prefill rows: items of unequal cost
    need = [-(-(c + n) // block) for c, n in rows]
    ids = torch.randperm(sum(need), generator=gen).tolist()
    tables = [ids[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(rows))]
    cache = KVCache(KVLayout(1, kv_heads, dim, kv_dtype), sum(need), block, torch.device("cpu"))
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    meta = step_metadata(rows, tables, block)
    tokens = meta.slot_mapping.numel()
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    return {
        name: CpuPagedAttention(cache, kernel).forward(0, q, k, v, meta, dim**-0.5, window)
        for name, kernel in kernels.items()
    }


@pytest.mark.parametrize(
    "dtype, kv_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)],
)
@pytest.mark.parametrize("window", [None, 9])
def test_the_attention_kernel_computes_the_openmp_builds_bits(attention_kernels, dtype, kv_dtype, window, threads):
    out = _attention(attention_kernels, dtype, kv_dtype, window)
    assert torch.equal(out["openmp"], out["pthreads"])


def test_a_compiler_that_refuses_openmp_builds_with_threads(monkeypatch, tmp_path, attention_kernels):
    """As Apple clang does ("unsupported option '-fopenmp'"): build.py asks it once, then builds
    with -pthread: here gcc behind a script that refuses the flag, whose build is the entry (the
    same flags and key) the tests above hold to the OpenMP build's bits."""
    real = native.compiler()
    cc = tmp_path / "cc-without-openmp"
    cc.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = -fopenmp ] && { echo "error: unsupported option -fopenmp" >&2; exit 1; }; done\n'
        f'exec {real} "$@"\n'
    )
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    version = subprocess.run([str(cc), "--version"], capture_output=True, text=True).stdout
    assert not native.build.takes_openmp(str(cc), version) and native.build.takes_openmp(real, version)
    path = native.build.build(cpu_paged.SOURCES, tmp_path / "kernels", native.cpu.at(LEVEL))
    assert path.is_file() and path.name == attention_kernels["pthreads"].path.name  # the same flags and key


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang")
def test_clang_builds_the_kernels(monkeypatch, tmp_path, gguf_libs):
    """clang (with libomp, or without: then POSIX threads) computes what gcc's build does, to the
    tolerance the levels keep to each other (compilers may fuse a float step differently)."""
    monkeypatch.setenv("CC", shutil.which("clang"))
    path = native.build.build(gguf_native.SOURCES, tmp_path, native.cpu.at(LEVEL))
    lib = gguf_native.bind(ctypes.CDLL(str(path)), path)
    n, k = 37, 512
    blocks = random_blocks("Q4_K", n, k, seed=9)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(10))
    want = gguf_native.matmul(
        gguf_libs["openmp"],
        "Q4_K",
        gguf_native.repack(gguf_libs["openmp"], "Q4_K", blocks, (n, k)),
        (n, k),
        x,
        packed=True,
    )
    got = gguf_native.matmul(lib, "Q4_K", gguf_native.repack(lib, "Q4_K", blocks, (n, k)), (n, k), x, packed=True)
    assert (got - want).norm() <= 1e-5 * want.norm()
