"""The GGUF block kernels (engine/native/gguf/) against gguf's own dequantization, at every CPU
level this machine can run (plain C, AVX2, AVX512 VNNI: each built for its level, as
TOKENROUTER_CPU_LEVEL builds it).

Blocks of random bytes are valid blocks of each type (every bit pattern decodes), so they
exercise every code, scale and high bit. Tolerances:
- the plain-C dot products equal a float64 emulation of llama.cpp's arithmetic (x rounded to
  int8 per block of 256 or 32 with scale max|x| / 127, times gguf's dequantized weights) to
  within 1e-5 relative: only float32 summation order differs (Q4_1's and Q5_1's too: m times
  x's scale times the sum of x's codes, their min term, is m's share of that product);
- each level's group kernels, on the blocks repacked 16 rows at a time, equal the plain one to
  within 1e-5 relative (measured: 2-4e-7), and a row's result is the same bits in a call of any
  rows; AVX2's are AVX512's bit for bit (the same integer sums, the same fused float steps);
- all are within 2% (relative, Frobenius) of x times the dequantized weight in float32: the
  int8 rounding of x (measured: 0.5-0.8% on the demo models' layers).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from tokenrouter.engine import native
from tokenrouter.engine.quant import gguf_native
from tokenrouter.engine.quant.gguf_blocks import GGUFBlockLinear, fits


def built(level: str, folder) -> gguf_native.Library:
    """The kernels built for `level` into `folder`, as the engine builds them at that level."""
    if native.compiler() is None:
        pytest.skip("no C compiler")
    path = native.build.build(gguf_native.SOURCES, folder, native.cpu.at(level))
    got = gguf_native.bind(ctypes.CDLL(str(path)), path)
    assert got.level == level
    return got


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """level -> the kernels built for it, every level this machine runs (built once)."""
    return {level: built(level, tmp_path_factory.mktemp(level)) for level in native.cpu.runnable()}


@pytest.fixture(params=native.cpu.runnable())
def lib(request, libs):
    return libs[request.param]


def random_blocks(kind: str, n: int, k: int, seed: int) -> torch.Tensor:
    values, size = gguf_native.BLOCKS[kind]
    gen = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 256, (n, k // values, size), dtype=torch.uint8, generator=gen)
    for at in gguf_native.SCALES[kind]:  # each block's fp16 scales
        scale = (torch.rand(n, k // values, generator=gen) * 2e-3 + 1e-4).to(torch.float16)
        b[..., at : at + 2] = scale.view(torch.uint8).view(n, k // values, 2)
    return b.reshape(n, -1)


def dequantized(kind: str, blocks: torch.Tensor, k: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = dequantize(blocks.numpy(), GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(-1, k)


def llama_cpp_arithmetic(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded to int8 per block (scale max|x| / 127, round half to even), times w, in float64."""
    m, k = x.shape
    xb = x.double().reshape(m, k // block, block)
    scale = xb.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(xb / torch.where(scale > 0, scale, 1)), 0)
    return (q * scale).reshape(m, k) @ w.double().t()


@pytest.mark.parametrize("kind", list(gguf_native.TYPES))
@pytest.mark.parametrize("rows", [1, 2, 7, 13])
def test_the_block_kernels_compute_llama_cpps_arithmetic(lib, kind, rows):
    n, k = 37, 512  # 37 rows of W: not a whole number of the kernel's chunks of 16
    blocks = random_blocks(kind, n, k, seed=rows)
    w = dequantized(kind, blocks, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows + 100))
    bias = torch.randn(n)
    plain = gguf_native.matmul(lib, kind, blocks, (n, k), x, bias).double()
    want = llama_cpp_arithmetic(x, w, gguf_native.BLOCKS[kind][0]) + bias.double()
    assert (plain - want).norm() <= 1e-5 * want.norm()
    packed = gguf_native.repack(lib, kind, blocks, (n, k))
    fast = gguf_native.matmul(lib, kind, packed, (n, k), x, bias, packed=True).double()
    assert (fast - plain).norm() <= 1e-5 * plain.norm()
    assert ((fast - plain).abs() <= 1e-4 * plain.abs().max()).all()  # every entry, the padded group's too
    exact = (x @ w.t() + bias).double()
    assert (fast - exact).norm() <= 0.02 * exact.norm()
    for i in range(rows):  # each row alone: the same bits as in the call of all of them
        alone = gguf_native.matmul(lib, kind, packed, (n, k), x[i : i + 1], bias, packed=True).double()
        assert torch.equal(alone[0], fast[i])


@pytest.mark.skipif("avx2" not in native.cpu.runnable() or "avx512" not in native.cpu.runnable(), reason="AVX512")
@pytest.mark.parametrize("kind", list(gguf_native.TYPES))
def test_avx2_computes_avx512s_bits(kind, libs):
    """The two vector levels run the same integer sums and the same fused float steps per row."""
    n, k = 40, 1024
    blocks = random_blocks(kind, n, k, seed=3)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(4)) * 3
    ys = [
        gguf_native.matmul(lib, kind, gguf_native.repack(lib, kind, blocks, (n, k)), (n, k), x, None, packed=True)
        for lib in (libs["avx2"], libs["avx512"])
    ]
    assert torch.equal(ys[0], ys[1])


def test_a_block_layer_takes_bf16_and_float32_inputs_of_any_leading_shape(lib):
    n, k = 64, 256
    blocks = random_blocks("Q4_K", n, k, seed=1)
    layer = GGUFBlockLinear(lib, "Q4_K", blocks, (n, k))
    x = torch.randn(2, 3, k)
    y32 = layer(x)
    y16 = layer(x.bfloat16())
    assert y32.shape == (2, 3, n) and y32.dtype == torch.float32 and y16.dtype == torch.bfloat16
    assert (y16.float() - y32).norm() <= 0.01 * y32.norm()  # bf16 input and output rounding
    assert layer.weight.shape == (n, k) and layer.weight.is_meta
    none = layer(torch.randn(0, k))  # a step where no row needs this layer (no row samples)
    assert none.shape == (0, n) and layer(torch.randn(2, 0, k)).shape == (2, 0, n)


def test_a_block_layer_refuses_what_the_kernels_cannot_take(lib):
    assert fits("Q4_K", 512) and not fits("Q4_K", 320) and fits("Q8_0", 320) and not fits("Q3_K", 256)
    assert fits("Q5_K", 512) and not fits("Q5_K", 320) and fits("Q4_0", 320) and fits("Q4_1", 320)
    with pytest.raises(ValueError, match="Q4_K x 320"):
        GGUFBlockLinear(lib, "Q4_K", torch.zeros(4, 180, dtype=torch.uint8), (4, 320))
    with pytest.raises(ValueError, match="blocks of a 4x256 weight"):
        GGUFBlockLinear(lib, "Q4_K", torch.zeros(4, 100, dtype=torch.uint8), (4, 256))


def test_without_a_compiler_the_library_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    got, why = gguf_native.load(home=tmp_path)
    assert got is None and "did not build" in why
    monkeypatch.setenv(gguf_native.ENV, "off")
    assert gguf_native.load(home=tmp_path / "other") == (None, f"{gguf_native.ENV}=off")


@pytest.mark.parametrize("kind", list(gguf_native.TYPES))
def test_table_rows_are_gguf_pys_dequantization_to_the_bit(lib, kind):
    """tr_gguf_rows (an embedding's looked-up rows) equals gguf-py's reference dequantization
    exactly, in any order of ids with repeats; an id outside the table is an IndexError."""
    n, k = 40, 512
    blocks = random_blocks(kind, n, k, seed=7)
    values, size = gguf_native.BLOCKS[kind]
    for at in gguf_native.SCALES[kind]:  # negative scales too: every other block's sign bit set
        blocks.view(n, k // values, size)[:, ::2, at + 1] |= 0x80
    want = dequantized(kind, blocks, k)
    ids = torch.tensor([[3, 0, 39], [3, 17, 5]])
    got = gguf_native.rows(lib, kind, blocks.numpy(), (n, k), ids)
    assert torch.equal(got, want[ids.reshape(-1)])
    assert gguf_native.rows(lib, kind, blocks.numpy(), (n, k), torch.tensor([], dtype=torch.int64)).shape == (0, k)
    for bad in (-1, n):
        with pytest.raises(IndexError, match="out of range"):
            gguf_native.rows(lib, kind, blocks.numpy(), (n, k), torch.tensor([0, bad]))
