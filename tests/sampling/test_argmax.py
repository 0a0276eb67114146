"""`sampling.argmax` answers as torch's argmax does, on every shape and dtype logits come in."""

import pytest
import torch

from tokenrouter.sampling import argmax


def _rows(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1000, generator=g).to(dtype)
    x[1, 17] = x[1, 900] = 50.0  # a tie: the first index wins
    x[2, 3] = x[2, 400] = float("nan")  # NaN counts as the maximum, the first one
    x[3] = float("-inf")  # every logit masked
    x[4, 999] = float("inf")
    x[5] = 0.0  # all equal
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_argmax_is_torchs_on_rows_with_ties_nan_and_masks(dtype):
    x = _rows(dtype)
    got = argmax(x)
    assert got.dtype == torch.int64 and got.device == x.device
    assert torch.equal(got, x.argmax(dim=-1))
    assert got.tolist()[1:] == [17, 3, 0, 999, 0]


def test_argmax_takes_views_one_row_and_more_dimensions():
    x = torch.randn(3, 5, 257, generator=torch.Generator().manual_seed(1))
    for view in (x, x[:, :2], x[1], x[0, 3], x.transpose(0, 1), x[..., ::2]):
        assert torch.equal(argmax(view), view.argmax(dim=-1)), view.shape
    assert argmax(x[0, 3]).shape == ()


def test_argmax_under_inference_mode_and_with_grad():
    with torch.inference_mode():
        x = torch.randn(2, 64)
        assert torch.equal(argmax(x), x.argmax(dim=-1))
    w = torch.randn(2, 64, requires_grad=True)
    assert torch.equal(argmax(w), w.argmax(dim=-1))
