"""Every policy's `route` and `verify` with their tensors on a (stand-in) accelerator, as the
engine hands them over on a GPU: logits, hidden states and sampled tokens on the device, the
per-request counts and drafts on the host (engine/handoff.py, engine/verify.py), or everything
on the device. Each answer must equal the CPU's, with no device mixed up, and with a pinned
number of host syncs (tokenrouter/testing/accelerator.py): a change that adds one fails here.

The engine reads each answer to the host (`.tolist()` of `keep`, `next_model`, `accept`): an
answer already on the host costs it nothing, one on the device a read each."""

from __future__ import annotations

import pytest
import torch

from tokenrouter import SamplingParams
from tokenrouter.policies import (
    CITER,
    R2R,
    BiLD,
    CoLLM,
    Escalation,
    ModelIdentity,
    RouterConfig,
    RouterNet,
    RStitch,
    Speculative,
    StepResult,
    VerifyResult,
    normalized_entropy,
)
from tokenrouter.testing.accelerator import StandInAccelerator

B, K, V, H = 4, 5, 64, 16
NUM_DRAFTS = [5, 2, 3, 1]


@pytest.fixture
def accel():
    with StandInAccelerator() as a:
        yield a


def host(accel, t):
    """A tensor's values, uncounted, wherever it is."""
    return (accel.peek(t) if accel.holds(t) else t).tolist()


def engine_reads(accel, *tensors) -> int:
    """How many reads the engine makes to take these answers to the host."""
    return sum(accel.holds(t) for t in tensors if t is not None)


def verify_input(temperature: float = 0.0, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, V, (B, K), generator=g)
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    for i, n in enumerate(NUM_DRAFTS):
        drafts[i, n:] = -1
        if i % 2 == 0:  # some drafts the target agrees with
            logits[i, :n].scatter_(-1, drafts[i, :n, None], 12.0)
    return {
        "start": torch.tensor([9, 10, 11, 12]),
        "num_drafts": torch.tensor(NUM_DRAFTS),
        "drafts": drafts,
        "logits": logits,
        "num_generated": torch.tensor([3, 4, 5, 6]),
        "params": [SamplingParams(temperature=temperature, top_k=20 if temperature else 0)] * B,
    }


def verify_result(fields: dict, states: list[dict], put=None, all_on_device: bool = False) -> VerifyResult:
    """`put` places the logits on the device, and the rest too when `all_on_device`."""
    placed = {
        k: put(v) if put is not None and (k == "logits" or all_on_device) and isinstance(v, torch.Tensor) else v
        for k, v in fields.items()
    }
    return VerifyResult(
        model="large",
        model_index=1,
        request_ids=[f"r{i}" for i in range(B)],
        sources=["small"] * B,
        states=states,
        seeds=[100 + i for i in range(B)],
        **placed,
    )


def step_result(model: str, index: int, logits, put=lambda t: t, params=None, **fields) -> StepResult:
    return StepResult(
        model=model,
        model_index=index,
        request_ids=[f"r{i}" for i in range(len(logits))],
        tokens=put(logits.argmax(-1)),
        logits=put(logits),
        num_generated=torch.arange(len(logits)),
        states=[{} for _ in range(len(logits))],
        params=params or [SamplingParams(temperature=0)] * len(logits),
        seeds=list(range(len(logits))),
        **{k: put(v) if isinstance(v, torch.Tensor) else v for k, v in fields.items()},
    )


# ---- verifying policies --------------------------------------------------------------------------
VERIFY_SYNCS = {  # (policy, placement): (reads, uploads) in verify; engine placement: drafts on the host
    ("bild", "engine"): (0, 2),  # the drafts and their counts copied to the logits
    ("bild", "device"): (0, 0),
    ("greedy", "engine"): (1, 0),  # the target's argmax read to the drafts
    ("greedy", "device"): (0, 0),
}


@pytest.mark.parametrize("placement", ["engine", "device"])
@pytest.mark.parametrize("name", ["bild", "greedy"])
def test_verify_on_the_accelerator_equals_the_cpu(accel, name, placement):
    fields = verify_input()
    make = (lambda: BiLD(rollback=4.0)) if name == "bild" else (lambda: Speculative(k=K))
    want = make().verify(verify_result(fields, [{} for _ in range(B)]))
    result = verify_result(fields, [{} for _ in range(B)], accel.put, all_on_device=placement == "device")
    with accel.syncs() as s:
        got = make().verify(result)
    assert host(accel, got.accept) == want.accept.tolist()
    assert want.tokens is None or host(accel, got.tokens) == want.tokens.tolist()
    assert 0 < sum(want.accept.tolist()) < sum(NUM_DRAFTS)  # some accepted, some rejected
    assert (s.reads, s.uploads) == VERIFY_SYNCS[name, placement], s.log
    assert engine_reads(accel, got.accept) == (name == "bild" or placement == "device")


def sampled_speculative(fields: dict, put=None, all_on_device: bool = False, accel=None):
    """Speculative at temperature > 0: the draft's route records its distributions (q) over
    each request's drafts, then the target verifies them. Returns the verdict and the syncs of
    the route (None on the CPU) and of the verify."""
    spec = Speculative(k=K)
    states = [{} for _ in range(B)]
    g = torch.Generator().manual_seed(1)
    counting = accel.syncs if accel is not None else None
    route_syncs = []
    for j in range(K):  # one draft step per position, for the requests with a draft there
        rows = [i for i in range(B) if j < NUM_DRAFTS[i]]
        draft_logits = fields["logits"][rows, j] + torch.randn(len(rows), V, generator=g)
        step = step_result("small", 0, draft_logits, put or (lambda t: t), params=[fields["params"][i] for i in rows])
        step.states = [states[i] for i in rows]
        step.tentative = torch.tensor([j + 1] * len(rows))
        if counting is None:
            spec.route(step)
            continue
        with counting() as s:
            spec.route(step)
        route_syncs.append((len(rows), s.reads, s.uploads))
    result = verify_result(fields, states, put, all_on_device)
    if counting is None:
        return spec.verify(result), None, None
    with counting() as s:
        verdict = spec.verify(result)
    return verdict, route_syncs, s


@pytest.mark.parametrize("placement", ["engine", "device"])
def test_sampled_speculative_on_the_accelerator_equals_the_cpu(accel, placement):
    fields = verify_input(temperature=0.8, seed=3)
    want, _, _ = sampled_speculative(fields)
    got, route_syncs, s = sampled_speculative(fields, accel.put, placement == "device", accel)
    assert host(accel, got.accept) == want.accept.tolist()
    assert host(accel, got.tokens) == want.tokens.tolist()
    accepted = want.accept.tolist()
    assert any(a < n for a, n in zip(accepted, NUM_DRAFTS)) and any(a > 0 for a in accepted)
    # the draft's route: its sampling tensors (two copies) per row that samples, no read
    assert route_syncs == [(rows, 0, 2 * rows) for rows, _, _ in route_syncs], route_syncs
    # verify: per request one read of its answer and two copies of its sampling tensors; the
    # drafts copied to the logits once; with everything on the device, the counts read too
    reads = B + (1 + B if placement == "device" else 0)  # + the counts, and each request's num_generated
    assert (s.reads, s.uploads) == (reads, 2 * B + (placement == "engine")), s.log
    assert engine_reads(accel, got.accept, got.tokens) == 0


def lookup_verify(fields: dict, put=None, all_on_device: bool = False, accel=None):
    """Speculative(lookup=True)'s verify of drafts the target proposed itself (sources = the
    target), and the syncs it made (None on the CPU)."""
    result = verify_result(fields, [{} for _ in range(B)], put, all_on_device)
    result.sources = ["large"] * B
    spec = Speculative(k=K, lookup=True)
    if accel is None:
        return spec.verify(result), None
    with accel.syncs() as s:
        verdict = spec.verify(result)
    return verdict, s


@pytest.mark.parametrize("placement", ["engine", "device"])
def test_sampled_lookup_verify_on_the_accelerator_equals_the_cpu(accel, placement):
    """A lookup draft is accepted where the target's own seeded draw there is the draft; the
    engine redraws the first rejection (token -1). Per request: its sampling tensors (two
    copies) and one read of the answer, as for the draft model's drafts."""
    fields = verify_input(temperature=0.8, seed=3)
    want, _ = lookup_verify(fields)
    got, s = lookup_verify(fields, accel.put, placement == "device", accel)
    assert host(accel, got.accept) == want.accept.tolist()
    assert host(accel, got.tokens) == want.tokens.tolist() == [-1] * B
    accepted = want.accept.tolist()
    assert any(a < n for a, n in zip(accepted, NUM_DRAFTS)) and any(a > 0 for a in accepted)
    reads = B + (1 + B if placement == "device" else 0)  # + the counts, and each request's num_generated
    assert (s.reads, s.uploads) == (reads, 2 * B + (placement == "engine")), s.log


def test_speculative_lookup_route_on_the_accelerator(accel):
    """The target's route with lookup reads the sampled tokens once (to look them up with the
    request's history, on the host) and proposes the same tokens as on the CPU."""
    logits = entropy_logits()
    tokens = logits.argmax(-1).tolist()
    history = [[5, 9, tokens[0], 8, 9], [1, 2, 3], [1, tokens[2], 6, 1], [4, 4], [3, tokens[4], 3], [5]]
    want = Speculative(k=3, lookup=True).route(step_result("large", 1, logits, history=history))
    with accel.syncs() as s:
        got = Speculative(k=3, lookup=True).route(step_result("large", 1, logits, accel.put, history=history))
    assert got.proposals == want.proposals and any(want.proposals) and not all(want.proposals)
    assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
    assert host(accel, got.next_model) == [1 if p else 0 for p in want.proposals]
    assert (s.reads, s.uploads) == (1, 0), s.log
    assert engine_reads(accel, got.keep, got.next_model) == 0


# ---- routing on the entropy ------------------------------------------------------------------------
def test_normalized_entropy_is_float32_for_bf16_logits(accel):
    """In bf16 the entropy misses by ~1e-2: routing decisions near tau would differ."""
    logits = (torch.randn(8, 1000, generator=torch.Generator().manual_seed(0)) * 2).bfloat16()
    want = normalized_entropy(logits.float())
    for x in (logits, accel.put(logits)):
        with accel.syncs() as s:
            h = normalized_entropy(x)
        assert h.dtype == torch.float32
        assert torch.equal(accel.peek(h) if accel.holds(h) else h, want)
        assert s.total == 0, s.log
    # wider logits keep their precision
    assert normalized_entropy(logits.double()).dtype == torch.float64


def entropy_logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, V, generator=g)
    logits[::2] *= 30  # peaked rows: low entropy
    return logits


@pytest.mark.parametrize("model, index", [("small", 0), ("large", 1)])
def test_rstitch_on_the_accelerator(accel, model, index):
    logits = entropy_logits()
    policy = RStitch(tau=0.3)
    want = policy.route(step_result(model, index, logits, entropy=normalized_entropy(logits)))
    step = step_result(model, index, logits, accel.put, entropy=normalized_entropy(logits))
    with accel.syncs() as s:
        got = policy.route(step)
    assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
    assert 0 < sum(want.next_model.tolist()) < len(logits)
    # one read of the decision; the engine then reads nothing
    assert (s.reads, s.uploads) == (1, 0), s.log
    assert engine_reads(accel, got.keep, got.next_model) == 0


@pytest.mark.parametrize("model, index", [("small", 0), ("large", 1)])
def test_bild_route_on_the_accelerator(accel, model, index):
    logits = entropy_logits()
    policy = BiLD(fallback=0.5)
    want = policy.route(step_result(model, index, logits))
    with accel.syncs() as s:
        got = policy.route(step_result(model, index, logits, accel.put))
    assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
    assert (s.reads, s.uploads) == ((1, 0) if model == "small" else (0, 0)), s.log
    assert engine_reads(accel, got.keep, got.next_model) == 0


@pytest.mark.parametrize("index", [0, 1, 2])
def test_escalation_on_the_accelerator(accel, index):
    logits = entropy_logits()
    policy = Escalation(["a", "b", "c"], [0.2, 0.5])
    name = policy.models[index]
    want = policy.route(step_result(name, index, logits, entropy=normalized_entropy(logits)))
    with accel.syncs() as s:
        got = policy.route(step_result(name, index, logits, accel.put, entropy=normalized_entropy(logits)))
    assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
    assert (s.reads, s.uploads) == (1, 0), s.log
    assert engine_reads(accel, got.keep, got.next_model) == 0


@pytest.mark.parametrize("model, index", [("small", 0), ("large", 1)])
def test_speculative_route_on_the_accelerator(accel, model, index):
    logits = entropy_logits()
    step = step_result(model, index, logits, accel.put)
    step.tentative = torch.tensor([1, 2, 3, 1, 2, 3])
    want = Speculative(k=3).route(step_result(model, index, logits, tentative=step.tentative))
    with accel.syncs() as s:
        got = Speculative(k=3).route(step)
    assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
    assert s.total == 0, s.log
    assert engine_reads(accel, got.keep, got.next_model) == 0


# ---- learned routers -------------------------------------------------------------------------------
def router(kind: str) -> RouterNet:
    torch.manual_seed(0)
    identity = ModelIdentity(hidden_size=H, vocab_size=V, fingerprint="0" * 16)
    config = RouterConfig(kind=kind, hidden_size=H, top_k=10, width=8, threshold=0.5, small=identity, large=identity)
    return RouterNet(config).eval()


@pytest.mark.parametrize("cls", [CITER, R2R, CoLLM])
def test_learned_routers_follow_the_hidden_states_to_the_accelerator(accel, cls):
    """The network moves once, on the first step, to the hidden states' device, and stays."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(8, V, generator=g)
    hidden = torch.randn(8, H, generator=g).bfloat16()  # models on a GPU run in bf16
    embedding = torch.randn(8, H, generator=g).bfloat16()
    net = router(cls.kind)
    cpu_step = step_result("small", 0, logits, hidden=hidden, token_embedding=embedding)
    threshold = float(cls(net).probability(cpu_step).median())  # about half the tokens deferred
    want = cls(net, threshold=threshold).route(cpu_step)
    assert 0 < sum(want.next_model.tolist()) < 8
    policy = cls(router(cls.kind), threshold=threshold)
    params = len(list(net.parameters()))
    for first in (True, False):
        step = step_result("small", 0, logits, accel.put, hidden=hidden, token_embedding=embedding)
        with accel.syncs() as s:
            got = policy.route(step)
        assert (host(accel, got.keep), host(accel, got.next_model)) == (want.keep.tolist(), want.next_model.tolist())
        assert (s.reads, s.uploads) == (1, params if first else 0), s.log
        assert engine_reads(accel, got.keep, got.next_model) == 0
        assert policy.device == accel.device
        assert all(accel.holds(p) for p in policy.router.parameters())
    with accel.syncs() as s:
        got = policy.route(step_result("large", 1, logits, accel.put))
    assert (got.keep.tolist(), got.next_model.tolist(), s.total) == ([True] * 8, [0] * 8, 0)
