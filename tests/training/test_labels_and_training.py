"""Token labels (the sufficient-compute map, the small model's features, the files), router training
(the threshold reproduces the claimed held-out recall with each policy's own comparison; saved
routers load, pass the pair check and serve), teacher-forced evaluation, and the CLI's `label`,
`train-router` and `generate --policy r2r|escalation`."""

from __future__ import annotations

import ast
import copy
import json
import math

import anyio
import pytest
import torch

from tests.cli.test_cli import pair_args, run_cli
from tests.conftest import TINY_PAIR_TAU
from tokenrouter import ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.engine import HiddenCapture
from tokenrouter.policies import CITER, R2R, CoLLM, normalized_entropy
from tokenrouter.policies.routers import (
    ModelIdentity,
    RouterConfig,
    RouterNet,
    check_pair,
    load_router,
    save_router,
)
from tokenrouter.testing import build_tiny_model, build_tokenizer, load_reference_models, reference_generate
from tokenrouter.training import label, python_corpus, read_jsonl
from tokenrouter.training.labels import Labels, summary
from tokenrouter.training.router_training import (
    defer,
    features,
    split_examples,
    teacher_forced_eval,
    train_router,
)

POLICIES = {"citer": CITER, "r2r": R2R, "collm": CoLLM}
MAX_TOKENS = 40  # response tokens labelled per example


def grown_copy(src, dst, extra_layers: int, noise: float, seed: int):
    """A larger model that mostly agrees with `src`: its layers, plus `extra_layers` new ones whose
    outputs are damped, every weight matrix perturbed by `noise`. Random tiny models almost never
    agree on a greedy token; a grown copy agrees on about half, so labels have both classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64)
    config = copy.deepcopy(small.config)
    config.num_hidden_layers += extra_layers
    config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
    torch.manual_seed(seed)
    big = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    with torch.no_grad():
        for p in big.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
        _, unexpected = big.load_state_dict(small.state_dict(), strict=False)
        assert not unexpected
        for layer in big.model.layers[small.config.num_hidden_layers :]:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
        for p in big.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p) * noise)
    big.generation_config = small.generation_config
    big.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


@pytest.fixture(scope="module")
def corpus():
    return python_corpus(12, seed=1)


@pytest.fixture(scope="module")
def trios(tmp_path_factory, tokenizer, tiny_pair):
    """Two sets of three models, smallest first: independent random ones (the medium model of
    test_learned_policies), and the tiny small model with two grown copies of it."""
    root = tmp_path_factory.mktemp("trios")
    medium = build_tiny_model(
        root / "medium",
        "qwen2",
        dtype=torch.float64,
        seed=3,
        tokenizer=tokenizer,
        logit_scale=3.0,
        num_hidden_layers=2,
        hidden_size=80,
    )
    return {
        "distinct": {"small": tiny_pair["small"], "medium": medium, "large": tiny_pair["large"]},
        "grown": {
            "small": tiny_pair["small"],
            "medium": grown_copy(tiny_pair["small"], root / "grown-medium", 1, 0.005, seed=5),
            "large": grown_copy(tiny_pair["small"], root / "grown-large", 2, 0.01, seed=6),
        },
    }


@pytest.fixture(scope="module")
def near_pair(trios):
    """A small model and a grown copy: about half of the tokens are hard."""
    return {"small": trios["grown"]["small"], "large": trios["grown"]["large"]}


@pytest.fixture(scope="module")
def near_labels(near_pair, corpus):
    return label(near_pair, corpus, max_tokens_per_example=MAX_TOKENS, dtype=torch.float64, progress=False)


# ---- the reference corpora -------------------------------------------------------------------------
def test_python_corpus_is_deterministic_stdlib_functions():
    a, b, other = python_corpus(20, seed=4), python_corpus(20, seed=4), python_corpus(20, seed=5)
    assert a == b and a != other
    for e in a:
        assert e["prompt"].startswith("Write a Python function `") and " (module " in e["prompt"]
        assert 200 <= len(e["response"]) <= 2000
        fn = ast.parse(e["response"]).body[0]
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        assert f"`{fn.name}`" in e["prompt"]
        assert e["prompt"].endswith(ast.get_docstring(fn).strip().splitlines()[0].strip())
        module = e["prompt"].split(" (module ", 1)[1].split(")", 1)[0]
        assert not {"test", "tests", "idlelib", "lib2to3"} & set(module.split(".")), module
    with pytest.raises(ConfigError, match="positive integer"):
        python_corpus(0)


def test_read_jsonl_takes_text_and_chat_prompts_and_names_bad_lines(tmp_path):
    good = tmp_path / "good.jsonl"
    rows = [
        {"prompt": "Reverse a string.", "response": "def rev(s):\n    return s[::-1]\n"},
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add."}],
            "response": "a + b",
        },
    ]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert read_jsonl(good) == rows
    for body, message in [
        ('{"prompt": "x", "response": "y"}\nnot json\n', r"bad.jsonl:2: not valid JSON"),
        ('{"prompt": "x"}\n', r"bad.jsonl:1: missing 'response'"),
        ('{"prompt": "x", "response": "y"}\n\n{"prompt": 3, "response": "y"}\n', r"bad.jsonl:3: \"prompt\" must be"),
        ('{"prompt": [{"role": "user"}], "response": "y"}\n', r"bad.jsonl:1: \"prompt\"\[0\] must be a chat message"),
        ('{"prompt": "x", "response": ""}\n', r"bad.jsonl:1: \"response\" is empty"),
        ("\n", "no examples"),
    ]:
        (tmp_path / "bad.jsonl").write_text(body)
        with pytest.raises(ConfigError, match=message):
            read_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")


# ---- labels ------------------------------------------------------------------------------------------
def _independent_labels(models: dict, examples, tokenizer):
    """Each model's greedy tokens (and the small model's features) the obvious way: a plain
    forward over prompt + response, nothing shared with `label`."""
    refs = load_reference_models(models, torch.float64)
    greedy = {m: [] for m in models}
    entropy = {m: [] for m in models}
    hidden, emb, top, tokens = [], [], [], []
    small = next(iter(models))
    for e in examples:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": e["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        response = tokenizer.encode(e["response"], add_special_tokens=False)[:MAX_TOKENS]
        ids = torch.tensor([list(prompt) + response])
        p = len(prompt)
        tokens += response
        for name, model in refs.items():
            capture = HiddenCapture(model)
            try:
                with torch.no_grad():
                    logits = model(ids).logits[0, p - 1 : -1]
                    h = capture.take()[0, p - 1 : -1]
            finally:
                capture.remove()
            g = logits.argmax(-1)
            greedy[name].append(g)
            entropy[name].append(normalized_entropy(logits))
            if name == small:
                hidden.append(h)
                with torch.no_grad():
                    emb.append(model.get_input_embeddings()(g))
                top.append(torch.log_softmax(logits, -1).topk(100).values)
    params = [sum(p.numel() for p in m.parameters()) for m in refs.values()]
    return (
        torch.stack([torch.cat(greedy[m]) for m in models], 1),
        torch.stack([torch.cat(entropy[m]) for m in models], 1),
        torch.cat(hidden),
        torch.cat(emb),
        torch.cat(top),
        torch.tensor(tokens),
        params,
    )


@pytest.mark.parametrize("trio", ["distinct", "grown"])
def test_sufficient_compute_map_over_three_models_is_the_hand_computed_one(trio, trios, corpus, tokenizer, tmp_path):
    models = trios[trio]
    examples = corpus[:6]
    labels = label(models, examples, max_tokens_per_example=MAX_TOKENS, dtype=torch.float64, progress=False)
    greedy, entropy, hidden, emb, top, tokens, params = _independent_labels(models, examples, tokenizer)

    # the map by hand: the smallest model whose greedy token is the largest model's
    expected = []
    for row in greedy.tolist():
        expected.append(next(i for i, g in enumerate(row) if g == row[-1]))
    expected = torch.tensor(expected)
    assert torch.equal(labels.greedy, greedy)
    assert torch.equal(labels.sufficient, expected)
    assert torch.equal(labels.token, tokens)
    if trio == "grown":
        assert set(expected.tolist()) == {0, 1, 2}, "every model is the sufficient one somewhere"
    torch.testing.assert_close(labels.entropy, entropy.float())
    torch.testing.assert_close(labels.hidden, hidden.float())
    torch.testing.assert_close(labels.token_embedding, emb.float())
    torch.testing.assert_close(labels.top_logprobs, top.float())
    assert all(t.dtype == torch.float32 for t in (labels.hidden, labels.token_embedding, labels.top_logprobs))
    lengths = [len(tokenizer.encode(e["response"], add_special_tokens=False)[:MAX_TOKENS]) for e in examples]
    assert labels.example.tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]
    assert labels.position.tolist() == [t for n in lengths for t in range(n)]
    assert labels.model_names == ["small", "medium", "large"] and labels.num_parameters == params

    # the summary by hand
    n = len(expected)
    s = summary(labels)
    assert s["examples"] == 6 and s["tokens"] == n
    assert s["sufficient_share"] == {m: expected.tolist().count(i) / n for i, m in enumerate(models)}
    k = math.ceil(n / 10)
    flops = [2 * params[i] for i in expected.tolist()]
    hardest = sorted(flops, reverse=True)[:k]
    assert s["hardest_tokens"] == k
    assert s["hardest_flops_share"] == pytest.approx(sum(hardest) / sum(flops), rel=1e-12)

    # files round-trip
    labels.save(tmp_path / "labels")
    back = Labels.load(tmp_path / "labels")
    for name, t in labels.tensors().items():
        assert torch.equal(getattr(back, name), t), name
    assert back.identities == labels.identities and back.num_parameters == labels.num_parameters
    assert json.loads((tmp_path / "labels" / "labels.json").read_text())["summary"]["tokens"] == n


def test_bad_labels_and_foreign_tokenizers_are_clear_errors(tmp_path, near_labels, tiny_pair, corpus):
    with pytest.raises(ConfigError, match="is not a directory"):
        Labels.load(tmp_path / "nowhere")
    good = near_labels.save(tmp_path / "good")
    missing = tmp_path / "missing"
    missing.mkdir()
    with pytest.raises(ConfigError, match="labels.json is missing"):
        Labels.load(missing)
    (missing / "labels.json").write_text((good / "labels.json").read_text())
    with pytest.raises(ConfigError, match="labels.safetensors is missing"):
        Labels.load(missing)
    (missing / "labels.safetensors").write_bytes((good / "labels.safetensors").read_bytes()[:200])
    with pytest.raises(ConfigError, match="labels.safetensors is corrupt"):
        Labels.load(missing)
    (missing / "labels.json").write_text("{not json")
    with pytest.raises(ConfigError, match="labels.json is not a valid labels file"):
        Labels.load(missing)

    other = build_tiny_model(tmp_path / "other-vocab", "qwen2", dtype=torch.float64, tokenizer=build_tokenizer(300))
    with pytest.raises(ConfigError, match="tokenizers of 'small' and 'odd' differ"):
        label({"small": tiny_pair["small"], "odd": other}, corpus[:1], progress=False)
    with pytest.raises(ConfigError, match="two or more models"):
        label({"small": tiny_pair["small"]}, corpus[:1], progress=False)
    with pytest.raises(ConfigError, match="no such file or directory"):
        label({"small": tiny_pair["small"], "large": tmp_path / "nope"}, corpus[:1], progress=False)


# ---- training ------------------------------------------------------------------------------------------
def _specs(paths):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8) for n, p in paths.items()}


async def _generate(policy, paths, prompt, params):
    async with Engine(models=_specs(paths), policy=policy, num_threads=1) as engine:
        return await engine.generate(prompt, params)


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_trained_router_has_the_recall_it_claims_and_serves(kind, near_labels, near_pair, tmp_path):
    assert 0.25 < float(near_labels.hard.float().mean()) < 0.75  # both classes, so training means something
    net, metrics = train_router(near_labels, kind, width=32, progress=False)
    out = save_router(net, tmp_path / kind)
    loaded = load_router(out, kind)
    assert loaded.config == net.config and loaded.config.threshold == metrics["threshold"]
    assert loaded.config.metrics["recall"] == metrics["recall"]
    refs = load_reference_models(near_pair, torch.float64)
    check_pair(loaded, refs["small"], refs["large"], ("small", "large"))

    # recompute the held-out recall with the policy built from the saved directory
    policy = POLICIES[kind](out)
    _, held = split_examples(near_labels, 0.2, 0)
    assert metrics["tokens_heldout"] == len(held) and metrics["tokens_train"] == len(near_labels) - len(held)
    p = loaded.probability(features(near_labels, kind, held))
    hard = near_labels.hard[held]
    deferred = policy.defer(p, policy.threshold)
    recall = int((deferred & hard).sum()) / int(hard.sum())
    assert recall == metrics["recall"] >= 0.95
    assert int(deferred.sum()) / len(held) == metrics["large_share"]
    assert int((deferred & hard).sum()) / int(deferred.sum()) == metrics["precision"]
    # ... and the threshold is tight: one float32 step towards deferring less misses the target
    t = torch.tensor(policy.threshold, dtype=torch.float32)
    less = float(torch.nextafter(t, torch.tensor(math.inf if kind != "citer" else -math.inf)))
    assert int((defer(kind, p, less) & hard).sum()) / int(hard.sum()) < 0.95
    assert 0.0 <= metrics["auc"] <= 1.0

    # it serves on the pair, token for token as the reference implementation
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = [5, 17, 42, 99, 7, 250]
    out_ = anyio.run(_generate, policy, near_pair, prompt, params)
    ref = reference_generate(policy, refs, prompt, params)
    assert out_.token_ids == ref.token_ids and out_.token_models == ref.token_models


def test_training_is_seeded_and_a_large_share_target_is_met(near_labels):
    a, ma = train_router(near_labels, "r2r", width=16, epochs=3, progress=False, seed=7)
    b, mb = train_router(near_labels, "r2r", width=16, epochs=3, progress=False, seed=7)
    assert ma == mb
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    for kind in ("collm", "citer"):
        net, m = train_router(near_labels, kind, width=16, epochs=3, progress=False, large_share=0.3)
        assert m["large_share"] == pytest.approx(0.3, abs=1.5 / m["tokens_heldout"])
        assert m["target_large_share"] == 0.3 and net.config.threshold == m["threshold"]


def test_training_needs_two_models_and_sane_targets(trios, corpus, near_labels):
    three = label(trios["grown"], corpus[:3], max_tokens_per_example=8, progress=False)
    with pytest.raises(ConfigError, match="these labels have 3"):
        train_router(three, "r2r", progress=False)
    with pytest.raises(ConfigError, match="not both"):
        train_router(near_labels, "r2r", target_recall=0.9, large_share=0.2, progress=False)
    with pytest.raises(ConfigError, match="kind must be one of"):
        train_router(near_labels, "magic", progress=False)
    with pytest.raises(ConfigError, match="heldout must be a fraction"):
        train_router(near_labels, "r2r", heldout=1.0, progress=False)


# ---- teacher-forced evaluation -----------------------------------------------------------------------
def _hand_labels() -> Labels:
    """Two examples (rows deliberately out of order), tau 0.5 and router outputs in hidden[:, 0].

    example 0: H_small .1 .9 .4 .3 .6   H_large .7 .8 .2 .9 .9   same greedy at 0, 1
    example 1: H_small .2 .7 .5 .1      H_large .9 .5 .9 .9      same greedy at 3
    RStitch(0.5) writers: ex0 S L L S L (ends on large), ex1 S L S S: 4 of 9 by the large model.
    """
    rows = [  # example, position, h_small, h_large, same greedy, p
        (1, 0, 0.2, 0.9, False, 0.3),
        (0, 0, 0.1, 0.7, True, 0.5),
        (0, 1, 0.9, 0.8, True, 0.9),
        (0, 2, 0.4, 0.2, False, 0.1),
        (1, 1, 0.7, 0.5, False, 0.5),
        (0, 3, 0.3, 0.9, False, 0.2),
        (0, 4, 0.6, 0.9, False, 0.7),
        (1, 2, 0.5, 0.9, False, 0.6),
        (1, 3, 0.1, 0.9, True, 0.0),
    ]
    n, h, k = len(rows), 4, 3
    hidden = torch.zeros(n, h)
    hidden[:, 0] = torch.tensor([r[5] for r in rows])
    ident = ModelIdentity(hidden_size=h, vocab_size=10, fingerprint="0" * 16)
    return Labels(
        model_names=["small", "large"],
        model_paths=["s", "l"],
        identities=[ident, ident],
        num_parameters=[1, 3],
        greedy=torch.tensor([[1, 1] if r[4] else [2, 3] for r in rows]),
        entropy=torch.tensor([[r[2], r[3]] for r in rows]),
        sufficient=torch.tensor([0 if r[4] else 1 for r in rows]),
        token=torch.zeros(n, dtype=torch.long),
        hidden=hidden,
        token_embedding=torch.zeros(n, h),
        top_logprobs=torch.zeros(n, k),
        example=torch.tensor([r[0] for r in rows]),
        position=torch.tensor([r[1] for r in rows]),
        num_examples=2,
    )


class _FirstColumn(RouterNet):
    """A router whose probability is its input's first column (the hand-set p)."""

    def probability(self, features):
        return features[:, 0].float()


def test_teacher_forced_eval_on_hand_made_labels():
    labels = _hand_labels()

    def run(name, **kw):
        r = teacher_forced_eval(labels, name, split="all", **kw)
        assert r["tokens"] == 9 and r["examples"] == 2
        return r["large_share"], r["agreement"]

    assert run("rstitch", tau=0.5) == pytest.approx((4 / 9, 6 / 9))
    assert run("large") == (1.0, 1.0)
    assert run("small") == pytest.approx((0.0, 3 / 9))

    def router(kind):
        ident = labels.identities[0]
        return _FirstColumn(
            RouterConfig(kind=kind, hidden_size=4, top_k=3, width=4, threshold=0.5, small=ident, large=ident)
        )

    # r2r defers p >= .5 (5 rows; of the 4 kept, one agrees), collm p > .5 (3 rows; 2 of the 6 kept
    # agree), citer confidence < .5 (4 rows; 2 of the 5 kept agree)
    assert run("r2r", router=router("r2r")) == pytest.approx((5 / 9, 6 / 9))
    assert run("collm", router=router("collm")) == pytest.approx((3 / 9, 5 / 9))
    assert run("citer", router=router("citer")) == pytest.approx((4 / 9, 6 / 9))
    assert run("r2r", router=router("r2r"), threshold=0.95) == pytest.approx((0.0, 3 / 9))

    # the held-out split is train_router's: one of the two examples
    held = teacher_forced_eval(labels, "large", heldout=0.5, seed=0)
    _, rows = split_examples(labels, 0.5, 0)
    assert held["tokens"] == len(rows) and held["examples"] == 1
    with pytest.raises(ConfigError, match="needs a router"):
        teacher_forced_eval(labels, "r2r", split="all")
    with pytest.raises(ConfigError, match="unknown policy"):
        teacher_forced_eval(labels, "magic", split="all")


# ---- the CLI -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_router(tmp_path_factory, tiny_pair):
    """`tokenrouter label` then `train-router --policy r2r` on the tiny pair, in-process."""
    capsys = _Capture()
    root = tmp_path_factory.mktemp("cli")
    models = [f"--model=small={tiny_pair['small']}", f"--model=large={tiny_pair['large']}"]
    code, out, err = capsys.run(
        [
            "label",
            *models,
            "--python-corpus",
            "6",
            "--max-tokens-per-example",
            "24",
            "--out",
            str(root / "labels"),
            "--threads",
            "1",
            "--seed",
            "2",
        ]
    )
    assert code == 0, err
    labelled = out
    code, out, err = capsys.run(
        [
            "train-router",
            "--policy",
            "r2r",
            "--labels",
            str(root / "labels"),
            "--out",
            str(root / "router"),
            "--epochs",
            "2",
            "--width",
            "16",
            "--threads",
            "1",
            "--heldout",
            "0.34",
        ]
    )
    assert code == 0, err
    return root, labelled, out


class _Capture:
    """run_cli for a module-scoped fixture (capsys is per test)."""

    def run(self, argv):
        import contextlib
        import io

        from tokenrouter import cli

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as e:
                code = e.code
        return code, out.getvalue(), err.getvalue()


def test_cli_label_and_train_router_on_the_tiny_pair(cli_router):
    root, labelled, trained = cli_router
    labels = Labels.load(root / "labels")
    assert labels.model_names == ["small", "large"] and labels.num_examples == 6
    assert len(labels) <= 6 * 24 and labels.source == "python_corpus(6, seed=2)"
    s = summary(labels)
    assert f"labelled 6 examples, {len(labels)} tokens" in labelled
    assert f"small {100 * s['sufficient_share']['small']:.1f}%" in labelled
    assert f"take {100 * s['hardest_flops_share']:.1f}% of the estimated FLOPs" in labelled
    net = load_router(root / "router", "r2r")
    assert labels.identities == [net.config.small, net.config.large]
    for word in (
        "AUC",
        "recall of hard tokens",
        "large-model share",
        f"threshold {net.config.threshold:.6g}",
        "saved to",
    ):
        assert word in trained, (word, trained)
    assert f"{100 * net.config.metrics['recall']:.1f}%" in trained


def test_cli_generate_with_a_trained_router(cli_router, tiny_pair, capsys):
    root = cli_router[0]
    argv = [
        "generate",
        "def add(a, b):",
        "--policy",
        "r2r",
        "--router",
        str(root / "router"),
        "--json",
        "--max-tokens",
        "8",
        *pair_args(tiny_pair),
    ]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    record = json.loads(out)
    threshold = load_router(root / "router", "r2r").config.threshold
    assert record["policy"] == f"R2R(threshold={threshold}, small='small', large='large')"
    assert len(record["token_ids"]) == 8 and set(record["token_models"]) <= {"small", "large"}
    code, out, err = run_cli([*argv, "--threshold", "1.0"], capsys)
    assert code == 0 and json.loads(out)["policy"].startswith("R2R(threshold=1.0,")


def test_cli_escalation_over_three_models(trios, capsys):
    models = [f"--model={m}={p}" for m, p in trios["grown"].items()]
    argv = [
        "generate",
        "hi",
        "--policy",
        "escalation",
        "--taus",
        f"{TINY_PAIR_TAU},{TINY_PAIR_TAU}",
        "--json",
        "--max-tokens",
        "6",
        "--threads",
        "1",
        *models,
    ]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["policy"].startswith("Escalation(models=['small', 'medium', 'large']")
    assert len(record["token_ids"]) == 6


# fmt: off
BAD_ARGUMENTS = [
    (["generate", "hi", "--policy", "r2r"], "--policy r2r needs --router DIR"),
    (
        ["generate", "hi", "--policy", "citer", "--router", "/no/such/router"],
        "router: /no/such/router is not a directory",
    ),
    (["generate", "hi", "--policy", "r2r", "--router", ".", "--threshold", "2"], "--threshold must be in [0, 1]"),
    (["generate", "hi", "--router", "/x"], "--router is only for --policy citer, r2r or collm"),
    (["generate", "hi", "--taus", "0.1"], "--taus is only for --policy escalation"),
    (["generate", "hi", "--policy", "escalation", "--model", "a=."], "needs two or more --model"),
    (["generate", "hi", "--policy", "escalation", "--model", "a=.", "--model", "b=.", "--model", "c=.",
      "--taus", "0.1"], "--taus: give one per model but the largest (2 for 3 models), got 1"),
    (["generate", "hi", "--policy", "escalation", "--taus", "0.1,x"], "expected comma-separated numbers"),
    (["label", "--out", "x"], "one of the arguments --data --python-corpus is required"),
    (["label", "--python-corpus", "2"], "the following arguments are required: --out"),
    (["label", "--python-corpus", "0", "--out", "x"], "--python-corpus: must be >= 1"),
    (["label", "--data", "/no/such.jsonl", "--out", "x"], "/no/such.jsonl: no such file"),
    (["label", "--python-corpus", "2", "--model", "a=.", "--out", "x"], "label needs two or more --model"),
    (["label", "--python-corpus", "2", "--model", "a=/no/dir", "--model", "b=.", "--out", "x"],
     "--model a=/no/dir: no such file or directory"),
    (["train-router", "--labels", "x", "--out", "y"], "the following arguments are required: --policy"),
    (["train-router", "--policy", "magic", "--labels", "x", "--out", "y"], "invalid choice: 'magic'"),
    (
        ["train-router", "--policy", "r2r", "--labels", "/no/labels", "--out", "y"],
        "labels: /no/labels is not a directory",
    ),
    (
        ["train-router", "--policy", "r2r", "--labels", "x", "--out", "y", "--recall", "1.5"],
        "--recall: must be in (0, 1]",
    ),
    (
        ["train-router", "--policy", "r2r", "--labels", "x", "--out", "y", "--heldout", "1"],
        "--heldout: must be in (0, 1)",
    ),
    (["train-router", "--policy", "r2r", "--labels", "x", "--out", "y", "--recall", "0.9", "--large-share", "0.1"],
     "not allowed with argument"),
]
# fmt: on


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS)
def test_bad_label_train_and_routing_arguments_give_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "store"))
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tokenrouter"), err
    assert message in err, err


def test_prompts_without_responses_get_the_largest_models_own(tiny_pair, tmp_path, capsys):
    """A JSONL line may leave the response out: the largest model writes it (greedy, through the
    engine), and labelling goes on over it."""
    from tokenrouter import Single
    from tokenrouter.training import generate_responses

    data = tmp_path / "prompts.jsonl"
    data.write_text(
        json.dumps({"prompt": "def add(a, b):", "response": "    return a + b"})
        + "\n"
        + json.dumps({"prompt": "The quick brown fox"})
        + "\n"
    )
    with pytest.raises(ConfigError, match=r"prompts.jsonl:2: missing 'response'"):
        read_jsonl(data)
    examples = read_jsonl(data, need_response=False)
    assert examples[1]["response"] is None
    filled = generate_responses(tiny_pair["large"], examples, max_tokens=12, dtype="float64", num_threads=1)
    assert filled[0] == examples[0]  # an example with a response is left as it is

    async def greedy():
        spec = ModelSpec(path=tiny_pair["large"], dtype="float64")
        async with Engine(models={"m": spec}, policy=Single("m"), num_threads=1) as engine:
            messages = [{"role": "user", "content": "The quick brown fox"}]
            return await engine.generate(messages, SamplingParams(temperature=0, max_tokens=12))

    assert filled[1]["response"] == anyio.run(greedy).text

    out = tmp_path / "labels"
    argv = [
        "label",
        *[f"--model={n}={p}" for n, p in tiny_pair.items()],
        "--data",
        str(data),
        "--out",
        str(out),
        "--max-tokens-per-example",
        "12",
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--json",
    ]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "large writes the response of 1 example(s)" in err
    labels = Labels.load(out)
    assert labels.num_examples == 2 and "responses by the largest model" in labels.source
