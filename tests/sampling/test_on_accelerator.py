"""The stand-in accelerator itself (tokenrouter/testing/accelerator.py), then the sampler,
penalties, logprobs and the grammar's bitmask with their tensors on it: each answer equal to the
CPU's, with a pinned number of host syncs."""

from __future__ import annotations

import pytest
import torch

from tokenrouter import SamplingParams
from tokenrouter.sampling import Sampler, SamplingTensors, token_logprobs
from tokenrouter.sampling.logits_processor import LogitsRow, allocate, apply_bitmask, process_logits
from tokenrouter.sampling.penalties import apply_penalties, penalize_rows
from tokenrouter.testing.accelerator import StandInAccelerator

SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture
def accel():
    with StandInAccelerator() as a:
        yield a


# ---- the stand-in ----------------------------------------------------------------------------------
def test_mixing_a_host_tensor_raises_as_cuda_does(accel):
    x = accel.put(torch.arange(12.0).reshape(3, 4))
    assert x.device == accel.device and x.shape == (3, 4)
    for mix in (
        lambda: x + torch.ones(4),
        lambda: x.gather(1, torch.zeros(3, 1, dtype=torch.long)),
        lambda: torch.searchsorted(x, torch.ones(3, 1)),
        lambda: torch.where(torch.ones(3, 4, dtype=torch.bool), x, torch.zeros(3, 4)),
    ):
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            mix()
    with pytest.raises(RuntimeError, match="indices should be either on cpu"):
        torch.ones(3)[accel.put(torch.tensor([0]))]
    # a host scalar (0-dim) mixes, as on CUDA; host indices index a device tensor, as on CUDA
    assert accel.peek(x * torch.tensor(2.0))[2, 3] == 22.0
    with accel.syncs() as s:
        assert accel.peek(x[torch.tensor([2, 0])])[:, 0].tolist() == [8.0, 0.0]
    assert (s.reads, s.uploads) == (0, 1), s.log


def test_factories_moves_views_and_in_place_ops(accel):
    x = accel.put(torch.zeros(3, 4))
    with accel.syncs() as s:
        made = [
            torch.arange(4, device=x.device),
            torch.zeros(2, device=x.device),
            torch.full((2,), 7, device=x.device),
            torch.empty(2, device=x.device),
            torch.rand(2, device=x.device, generator=torch.Generator().manual_seed(0)),
            x.new_zeros(2),
            torch.ones_like(x),
        ]
    assert all(accel.holds(t) for t in made) and s.total == 0, s.log
    x[:, 1:3].add_(1.0)  # a view shares the data
    x.view(-1)[0] = 5.0
    out = torch.empty(3, 4, device=x.device)
    torch.cumsum(x, dim=1, out=out)
    assert accel.peek(x)[0].tolist() == [5.0, 1.0, 1.0, 0.0]
    assert accel.peek(out)[0].tolist() == [5.0, 6.0, 7.0, 7.0]
    with accel.syncs() as s:
        t = torch.tensor([1, 2], device=accel.device)
        up = torch.ones(2).to(accel.device)
        down = x.cpu()
    assert accel.holds(t) and accel.holds(up) and not accel.holds(down) and down.device.type == "cpu"
    assert (s.reads, s.uploads) == (1, 2), s.log


def test_host_reads_are_counted(accel):
    x = accel.put(torch.tensor([[0.0, 3.0], [1.0, 0.0]]))
    with accel.syncs() as s:
        x.sum().item()
        x.tolist()
        int(x[0, 1])
        bool((x > 2).any())
        x.nonzero()
        x[x > 0]
        x[accel.put(torch.tensor(1))]  # a 0-dim index on the device is read as a Python int
    assert s.reads == 7 and s.uploads == 0, s.log
    with accel.syncs() as s:
        x[x > 2] = 0.0  # filled in place on the device
        torch.softmax(x, -1).topk(1, dim=-1)
        x.sort(dim=-1)
        torch.multinomial(torch.softmax(x, -1), 1, generator=torch.Generator().manual_seed(0))
    assert s.total == 0, s.log


# ---- sampling --------------------------------------------------------------------------------------
PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.2, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.9, min_p=0.05),
]


def logits_batch(rows: int = len(PARAMS), vocab: int = 97, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)) * 2).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampler_on_the_accelerator_equals_the_cpu(accel, dtype):
    logits = logits_batch(dtype=dtype)
    seeds, steps = list(range(len(PARAMS))), [3] * len(PARAMS)
    sampler = Sampler()
    cpu = SamplingTensors.build(PARAMS, seeds, steps, "cpu")
    with accel.syncs() as s:
        st = SamplingTensors.build(PARAMS, seeds, steps, accel.device)
    assert (s.reads, s.uploads) == (0, 2), s.log  # the float fields and the integer ones
    x = accel.put(logits)
    with accel.syncs() as s:
        tokens = sampler(x, st)
        probs = sampler.probs(x, st)
        logprobs = sampler.logprobs(x, st)
    assert s.total == 0, s.log
    assert accel.peek(tokens).tolist() == sampler(logits, cpu).tolist()
    assert torch.equal(accel.peek(probs), sampler.probs(logits, cpu))
    assert torch.equal(accel.peek(logprobs), sampler.logprobs(logits, cpu))


def test_token_logprobs_on_the_accelerator(accel):
    logits = logits_batch()
    lp = torch.log_softmax(logits, -1)
    tokens = logits.argmax(-1)
    want = token_logprobs(lp, tokens, [0, 1, 3, 0, 5, 2], "m")
    with accel.syncs() as s:
        got = token_logprobs(accel.put(lp), accel.put(tokens), [0, 1, 3, 0, 5, 2], "m")
    assert got == want
    assert (s.reads, s.uploads) == (4, 0), s.log  # the chosen values, the top values and ids, the tokens


def test_penalties_on_the_accelerator(accel):
    logits = logits_batch(rows=3)
    contexts = [[1, 2, 2, 5, 9], [3, 3, 3], [7, 1]]
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.2),
        SamplingParams(repetition_penalty=0.9, frequency_penalty=-0.3),
    ]
    args = (contexts, [2, 1, 1], [5, 3, 2], params)
    want = penalize_rows(logits, *args)
    with accel.syncs() as s:
        got = penalize_rows(accel.put(logits), *args)
    assert torch.equal(accel.peek(got), want)
    assert (s.reads, s.uploads) == (0, 7), s.log  # the token table, its row index and five [R] tensors
    tensors = [torch.tensor([[1, 2, 2, 5, 9], [3, 3, 3, 0, 0], [7, 1, 0, 0, 0]]), torch.tensor([2, 1, 1])]
    tensors += [torch.tensor([5, 3, 2]), torch.tensor([1.3, 1.0, 0.9]), torch.tensor([0.0, 0.5, -0.3])]
    tensors += [torch.tensor([0.0, 0.2, 0.0])]
    with accel.syncs() as s:
        got = apply_penalties(accel.put(logits), *[accel.put(t) for t in tensors])
    assert torch.equal(accel.peek(got), apply_penalties(logits, *tensors)) and s.total == 0, s.log


class EvenTokens:
    """A grammar that allows the even token ids below a bound (a RowGrammar)."""

    def __init__(self, bound: int):
        self.bound = bound

    def seek(self, n, token_ids) -> None:
        pass

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        allowed = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
        allowed[: self.bound : 2] = True
        bits = allowed.view(-1, 32).long() << torch.arange(32)
        bitmask[row] = bits.sum(-1).to(torch.int64).bitwise_and(0xFFFFFFFF).to(torch.int32)


def test_grammar_bitmask_on_the_accelerator(accel):
    logits = logits_batch(rows=4, vocab=70)  # wider than the bitmask's 64 ids: those are forbidden
    rows = [
        LogitsRow([1, 2], 1, 2, SamplingParams(), EvenTokens(40)),
        LogitsRow([1, 2], 1, 2, SamplingParams()),
        LogitsRow([1, 2, 2], 1, 3, SamplingParams(presence_penalty=1.0), EvenTokens(64)),
        LogitsRow([1], 1, 1, SamplingParams()),
    ]
    bitmask = allocate(2, 64)
    rows[0].grammar.fill(bitmask, 0)
    rows[2].grammar.fill(bitmask, 1)
    want = logits.clone()
    apply_bitmask(want, [0, 2], bitmask)
    x = accel.put(logits)
    with accel.syncs() as s:
        apply_bitmask(x, [0, 2], bitmask)
    assert torch.equal(accel.peek(x), want)
    assert (s.reads, s.uploads) == (0, 2), s.log  # the bitmask and the rows
    assert torch.isinf(want[0, 1]) and not torch.isinf(want[0, 2]) and torch.isinf(want[2, 64:]).all()
    with accel.syncs() as s:
        got = process_logits(accel.put(logits), rows)
    assert torch.equal(accel.peek(got), process_logits(logits, rows))
    assert (s.reads, s.uploads) == (0, 1 + 7 + 2), s.log  # the penalized rows' index, penalties, mask
