"""The real demo pair (Qwen2.5-Coder 0.5B and 1.5B): `Engine()` with no arguments serves it from
the store under RStitch, and both models write tokens of a coherent answer, at this CPU's level
and each lower one (as an AVX2 or a plain CPU would run it), and where torch's bf16 ops raise as
on an AVX2 CPU; every other way of naming its models computes as `Engine()` does; GGUFs of every
llama.cpp type load.

Runs when the pair is in the store (README's main-job command puts it there; or
`tokenrouter pull demo`), and is skipped otherwise: fetching and converting it takes minutes.
"""

from __future__ import annotations

import anyio
import pytest

from tests.helpers import bf16_raises_as_on_an_avx2_cpu, moved_under_load, token_signature, wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams, Single, store
from tokenrouter.policies import RStitch
from tokenrouter.testing.gguf import LLAMA_FTYPES

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
        reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
    ),
]


def _rstitch_answer():
    async def main():
        async with Engine(num_threads=2) as engine:
            question = [{"role": "user", "content": "Write a Python function that returns the factorial of n."}]
            out = await engine.generate(question, SamplingParams(temperature=0, max_tokens=40))
            await wait_all_free(engine)
            return out, engine.stats(), {m: model.precision for m, model in engine.info().models.items()}

    return anyio.run(main)


# Not at plain below the process's level: there the 1.5B computes on the plain C block kernels and
# the 0.5B from dense float32 weights (about 1.5 minutes here, and a 2 GB dense copy written once);
# `TOKENROUTER_CPU_LEVEL=plain pytest tests/test_real_demo_pair.py` runs it so.
@pytest.mark.cpu_levels(lowest="avx2")
def test_rstitch_on_the_demo_pair_uses_both_models(cpu_level):
    out, stats, precisions = _rstitch_answer()
    assert all(f"CPU level {cpu_level}" in p for p in precisions.values()), precisions
    assert out.finish_reason in ("stop", "length") and out.error is None
    counts = out.tokens_per_model()
    assert counts.get("small", 0) > 0 and counts.get("large", 0) > 0, counts
    assert out.num_handoffs >= 1
    assert "def " in out.text and "factorial" in out.text  # a coherent answer, not noise
    assert stats["large"].handoffs_received >= 1


def test_where_torchs_bf16_ops_raise_as_on_an_avx2_cpu_the_demo_pair_answers(monkeypatch):
    """README's main job on a CPU where torch's bf16 linear raises (an AVX2 CPU: the error word for
    word): bf16 counts as not available, never as an error, and the pair answers."""
    monkeypatch.delenv("TOKENROUTER_PROBE_SIMULATE", raising=False)  # the real bf16 probe, which raises
    bf16_raises_as_on_an_avx2_cpu(monkeypatch)
    out, _, precisions = _rstitch_answer()
    assert out.error is None and "def " in out.text and "factorial" in out.text
    assert out.tokens_per_model().get("large", 0) > 0
    assert all("bfloat16" not in p.split(" (")[0] for p in precisions.values()), precisions


QUESTIONS = [  # short coding questions, as completions: alone, then among as many others
    "def add(a, b):",
    "# Reverse a string in Python\n",
    'def is_even(n):\n    """Return True if n is even."""',
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "def fibonacci(n):\n    # iterative",
    "# Sort a list of tuples by their second item\n",
    "def count_words(text):",
    'def merge_dicts(a, b):\n    """Merge b into a copy of a."""',
    "SELECT name FROM users WHERE",
    "def binary_search(items, target):",
    "async def fetch(url):",
]
OTHERS = [f"# {i + 1}: another task\n" * (1 + i % 4) + q for i, q in enumerate(reversed(QUESTIONS))]


def _same_tokens_params(i: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=6 + 2 * (i >= 12) * (i % 3), ignore_eos=True, logprobs=1)


def _alone_and_among_others(policy, models=None, alone_too: bool = True):
    """(QUESTIONS' signatures alone, one at a time (None unless `alone_too`), the same among OTHERS
    (24 in flight), the workers' stats) under `policy`."""

    async def main():
        async with Engine(policy=policy, num_threads=2, **({} if models is None else {"models": models})) as engine:
            alone = None
            if alone_too:
                alone = [
                    token_signature(await engine.generate(q, _same_tokens_params(i))) for i, q in enumerate(QUESTIONS)
                ]
            loaded: list = [None] * (2 * len(QUESTIONS))

            async def one(i: int, prompt: str) -> None:
                loaded[i] = token_signature(await engine.generate(prompt, _same_tokens_params(i)))

            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(QUESTIONS + OTHERS):
                    tg.start_soon(one, i, prompt)
            await wait_all_free(engine)
            return alone, loaded[: len(QUESTIONS)], engine.stats()

    return anyio.run(main)


@pytest.fixture(scope="module")
def large_alone_and_loaded():
    """The 1.5B alone under Single (only it loaded): the reference every policy is held to."""
    return _alone_and_among_others(Single("large"), models={"large": store.DEFAULT_MODELS["large"]})


@pytest.mark.parametrize("policy", ["single", "rstitch", "bild", "speculative"])
def test_every_request_writes_its_own_tokens_among_others_on_the_demo_pair(policy, large_alone_and_loaded):
    """Same tokens at any load (docs/policies.md): 12 greedy requests alone, one at a time, then
    the same 12 among 12 others of other lengths (24 in flight), under a policy of each kind; every
    request's tokens and their logprobs' bits are the same. `Speculative(k="auto")` is lossless, so
    its requests among others are held to the 1.5B's own answers alone (its own alone run would
    be those too: tests/policies/test_verifying.py)."""
    from tests.test_same_tokens_at_any_load import POLICIES

    if policy == "single":
        alone, loaded, stats = large_alone_and_loaded
    elif policy == "speculative":
        _, loaded, stats = _alone_and_among_others(POLICIES["speculative"](), alone_too=False)
        alone = large_alone_and_loaded[0]
    else:
        make = {"rstitch": lambda: RStitch(tau=0.03), "bild": POLICIES["bild"]}[policy]
        alone, loaded, stats = _alone_and_among_others(make())
    assert moved_under_load(alone, loaded) == []
    # they did share steps (under load Speculative(auto) may leave the draft model idle)
    assert max(max(s.batch_size_histogram, default=1) for s in stats.values()) > 1


def _large_model(form, tokens: int = 12):
    """(precision, kernels, greedy token ids) of the demo 1.5B named as `form` (None: `Engine()`'s own)."""

    async def main():
        models = {} if form is None else {"models": {"large": form}}
        async with Engine(policy=Single("large"), num_threads=2, **models) as engine:
            question = [{"role": "user", "content": "Write a Python function that returns the factorial of n."}]
            out = await engine.generate(question, SamplingParams(temperature=0, max_tokens=tokens))
            m = engine.info().models["large"]
            return m.precision, m.linear_kernel, out.token_ids

    return anyio.run(main)


def _forms(tmp_path) -> dict:
    """Every way of naming the demo 1.5B; "own gguf" and "own gguf's directory" are a GGUF of the
    user's own: a path outside the store, whose config and tokenizer are derived apart."""
    name = store.DEFAULT_MODELS["large"]
    directory = store.locate_model(name)
    gguf = store.gguf_for(directory)
    own = tmp_path / "mine" / "model.gguf"
    own.parent.mkdir()
    own.symlink_to(gguf)
    return {
        "store name": name,
        "store directory": str(directory),
        "store gguf": str(gguf),
        "ModelSpec(path=store dir)": ModelSpec(path=directory),
        "own gguf": str(own),
        "own gguf's directory": str(own.parent),
    }


# Each form resolves as Engine() does on the tiny store (tests/engine/model/test_model_forms.py,
# every form); here on the real files, the two whose config and tokenizer come from the real GGUF
# apart from the store's run by default, the others with -m slow (a load of the 1.5B each).
@pytest.mark.parametrize(
    "forms",
    [
        ("store gguf", "own gguf"),
        pytest.param(
            ("store name", "store directory", "ModelSpec(path=store dir)", "own gguf's directory"),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["default", "slow"],
)
def test_every_form_of_the_large_model_runs_as_engine_does(tmp_path, forms):
    """A store name, its directory, its `.gguf`, `ModelSpec(path=...)` and a GGUF of the user's own
    (a copy outside the store, named by path and by directory) compute as `Engine()` does."""
    default = _large_model(None)
    assert "gguf" in default[0] and "blocks" in default[1], default
    named = _forms(tmp_path)
    for what in forms:
        assert _large_model(named[what]) == default, what


@pytest.mark.slow
@pytest.mark.parametrize("ftype", LLAMA_FTYPES)
def test_a_gguf_of_each_llama_cpp_type_loads_and_answers(tmp_path_factory, ftype):
    """The demo 0.5B requantized by llama.cpp's own quantizer into each of its file types: the types
    the block kernels take compute from their blocks, the others (Q2_K, Q3_K, IQ4_NL) are
    dequantized with the reason said, and each writes a coherent answer. Needs llama-cpp-python
    (`tokenrouter[anchor]`); agreement with llama.cpp itself: benchmarks/quality/bench_gguf_types.py."""
    pytest.importorskip("llama_cpp")
    from tokenrouter.engine import tensor_places
    from tokenrouter.engine.quant.gguf_blocks import KINDS
    from tokenrouter.testing.gguf import requantize

    source = store.gguf_for(store.locate_model(store.DEFAULT_MODELS["small"]))
    gguf = requantize(source, ftype, tmp_path_factory.mktemp("types") / f"{ftype}.gguf")
    types = {t.kind for name, t in tensor_places(gguf).items() if len(t.shape) == 2 and name != "token_embd.weight"}
    precision, kernels, _ = _large_model(str(gguf), tokens=1)
    unserved = sorted(types - KINDS)
    assert "blocks" in kernels, kernels
    if unserved:
        assert f"{unserved[0]} tensors dequantized" in kernels, kernels
    else:
        assert "dequantized" not in kernels, kernels

    async def answer():
        async with Engine(models={"m": str(gguf)}, policy=Single("m"), num_threads=2) as engine:
            question = [{"role": "user", "content": "Write a Python function that returns the factorial of n."}]
            return (await engine.generate(question, SamplingParams(temperature=0, max_tokens=48))).text

    text = anyio.run(answer)
    assert "def " in text, text
