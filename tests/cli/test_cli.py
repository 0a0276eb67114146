"""The `tokenrouter` command: help, bad arguments, generate (plain, coloured, JSON), chat, models."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tokenrouter import SamplingParams, cli
from tokenrouter.cli import bench_command, engine_setup
from tokenrouter.policies import BiLD, RStitch, Speculative
from tokenrouter.testing import load_reference_models, reference_generate

ROOT = Path(__file__).resolve().parents[2]


def run_cli(argv, capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def empty_store(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "store"))
    return tmp_path / "store"


def pair_args(pair) -> list[str]:
    return [f"--model=small={pair['small']}", f"--model=large={pair['large']}", "--threads=1", f"--tau={TINY_PAIR_TAU}"]


# ---- help and bad arguments --------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["generate"], ["chat"], ["pull"], ["models"], ["label"], ["train-router"]])
def test_every_help_is_complete(command, capsys):
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert out.startswith("usage: tokenrouter")
    expected = {
        (): ["generate", "chat", "pull", "models", "label", "train-router", "--version"],
        ("generate",): [
            "prompt",
            "--json",
            "--raw",
            "--policy",
            "--tau",
            "--model NAME=PATH",
            "--max-tokens",
            "--temperature",
            "--seed",
            "--threads",
            "--device",
            "--no-color",
            "--no-pull",
            "--router DIR",
            "--threshold",
            "--taus",
            "citer",
            "r2r",
            "collm",
            "escalation",
            "speculative",
            "bild",
            "--k N|auto",
            "--fallback P",
            "--rollback D",
            "--precision {auto,float32,bfloat16,gguf,gguf+bf16}",
        ],
        ("chat",): [
            "/reset",
            "--policy",
            "--tau",
            "--model NAME=PATH",
            "--max-tokens",
            "--temperature",
            "--seed",
            "--k N|auto",
            "--fallback P",
            "--rollback D",
            "--precision",
        ],
        ("pull",): ["demo", "smollm2", "qwen-coder-1.5b", "sha256"],
        ("models",): ["size"],
        ("label",): [
            "--model NAME=PATH",
            "--data FILE.jsonl",
            "--python-corpus N",
            "--max-tokens-per-example",
            "--seed",
            "--out DIR",
            "--dtype",
            "--no-pull",
            "labels.safetensors",
            "labels.json",
            "FLOPs",
        ],
        ("train-router",): [
            "--policy {citer,r2r,collm}",
            "--labels DIR",
            "--out DIR",
            "--recall",
            "--large-share",
            "--epochs",
            "--seed",
            "--heldout",
            "AUC",
            "router.json",
            "router.safetensors",
        ],
    }[tuple(command)]
    for word in expected:
        assert word in out, (word, out)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate"], "the following arguments are required: prompt"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["generate", "hi", "--model", "foo"], "expected NAME=PATH, got 'foo'"),
        (["generate", "hi", "--max-tokens", "0"], "--max-tokens: must be >= 1"),
        (["generate", "hi", "--policy", "magic"], "invalid choice: 'magic'"),
        (["generate", "hi", "--tau", "2"], "--tau must be in [0, 1], got 2.0"),
        (["generate", "hi", "--temperature", "-1", "--model", "small=."], "--temperature: Input should be greater"),
        (["generate", "hi", "--top-p", "0"], "--top-p: Input should be greater than 0"),
        (["generate", "hi", "--model", "huge=."], "the rstitch policy names its models ['small', 'large']"),
        (["generate", "hi", "--model", "small=/no/such/dir"], "--model small=/no/such/dir: no such file or directory"),
        (["generate", "hi", "--policy", "single"], "--policy single needs exactly one --model"),
        (["generate", "   "], "prompt: is empty"),
        (["generate", "hi", "--device", "nonsense"], "--device: not a torch device: 'nonsense'"),
        (["pull", "gpt-17"], "unknown model 'gpt-17'"),
        # a knob of speculative or bild given to a policy that does not take it
        (["generate", "hi", "--k", "4"], "--k is only for --policy speculative"),
        (["generate", "hi", "--policy", "bild", "--k", "auto"], "--k is only for --policy speculative"),
        (["generate", "hi", "--fallback", "0.5"], "--fallback is only for --policy bild"),
        (["generate", "hi", "--policy", "speculative", "--fallback", "0.5"], "--fallback is only for --policy bild"),
        (["chat", "--policy", "speculative", "--rollback", "3"], "--rollback is only for --policy bild"),
        (["generate", "hi", "--policy", "escalation", "--rollback", "3"], "--rollback is only for --policy bild"),
        # bad values name the flag and the limit
        (
            ["generate", "hi", "--policy", "speculative", "--k", "0"],
            "--k: must be an integer in [1, 64] or auto, got 0",
        ),
        (["generate", "hi", "--policy", "speculative", "--k", "65"], "--k: must be an integer in [1, 64] or auto"),
        (["chat", "--policy", "speculative", "--k", "foo"], "--k: expected an integer in [1, 64] or auto, got 'foo'"),
        (["generate", "hi", "--policy", "bild", "--fallback", "1.5"], "--fallback: must be in [0, 1], got 1.5"),
        (["generate", "hi", "--policy", "bild", "--fallback", "x"], "--fallback: expected a number, got 'x'"),
        (["generate", "hi", "--policy", "bild", "--rollback", "0"], "--rollback: must be > 0, got 0"),
        (["generate", "hi", "--policy", "bild", "--rollback", "-2"], "--rollback: must be > 0, got -2"),
        (["generate", "hi", "--precision", "fp8"], "--precision: invalid choice: 'fp8'"),
        (["generate", "hi", "--policy", "speculative", "--model", "huge=."], "names its models ['small', 'large']"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv, message, capsys, empty_store):
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tokenrouter"), err
    assert message in err, err


# ---- policies and precision from the arguments (nothing loaded) --------------------------------
def parse(*argv: str):
    return cli.build_parser().parse_args(["generate", "hi", *argv])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--policy", "speculative"], Speculative(k=4)),
        (["--policy", "speculative", "--k", "8"], Speculative(k=8)),
        (["--policy", "speculative", "--k", "64"], Speculative(k=64)),
        (["--policy", "speculative", "--k", "auto"], Speculative(k="auto")),
        (["--policy", "bild"], BiLD(fallback=0.9, rollback=2.0)),
        (["--policy", "bild", "--fallback", "0.6", "--rollback", "5"], BiLD(fallback=0.6, rollback=5.0)),
        (["--policy", "bild", "--fallback", "1", "--rollback", "0.5"], BiLD(fallback=1.0, rollback=0.5)),
        (["--policy", "bild", "--rollback", "3"], BiLD(fallback=0.9, rollback=3.0)),
    ],
)
def test_speculative_and_bild_are_built_with_their_knobs(argv, expected):
    policy = engine_setup.policy_from_args(parse(*argv))
    assert type(policy) is type(expected) and repr(policy) == repr(expected)
    assert policy.models == ["small", "large"]


@pytest.mark.parametrize(
    "precision, dtype, quantization",
    [
        ("auto", "auto", "auto"),
        ("float32", "float32", "auto"),
        ("bfloat16", "bfloat16", "auto"),
        ("gguf", "auto", "gguf"),
        ("gguf+bf16", "auto", "gguf+bf16"),
    ],
)
def test_precision_sets_each_models_spec(precision, dtype, quantization, tiny_pair):
    args = parse(*pair_args(tiny_pair), "--policy", "bild", "--precision", precision, "--device", "cpu")
    specs = engine_setup.models_from_args(args, engine_setup.policy_from_args(args))
    assert set(specs) == {"small", "large"}
    for name, spec in specs.items():
        assert spec.path == tiny_pair[name]  # gguf: not checked for a GGUF until it loads
        assert (spec.dtype, spec.quantization, spec.device) == (dtype, quantization, "cpu")


def test_precision_gguf_on_a_gpu_is_a_usage_error_naming_the_flag(capsys, tiny_pair, monkeypatch):
    monkeypatch.setattr(engine_setup, "device_from_arg", lambda arg: "cuda")  # as if this machine had CUDA
    code, out, err = run_cli(["generate", "hi", "--precision", "gguf", *pair_args(tiny_pair)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tokenrouter: error: --precision gguf (small): "), err
    assert "'cpu'" in err and "'cuda'" in err, err


def test_bench_takes_precision_as_generate_does(tiny_pair):
    def config(*argv):
        args = cli.build_parser().parse_args(["bench", "--quick", *pair_args(tiny_pair), "--device", "cpu", *argv])
        return bench_command.bench_config(args)

    cfg = config("--precision", "bfloat16")
    assert (cfg.dtype, cfg.model_options) == ("bfloat16", {})
    cfg = config("--precision", "gguf")
    assert cfg.dtype == "auto" and cfg.model_options == {m: {"quantization": "gguf"} for m in ("small", "large")}
    cfg = config("--dtype", "float64")
    assert (cfg.dtype, cfg.model_options) == ("float64", {})
    with pytest.raises(cli.UsageError, match=r"^--dtype float64 and --precision float32: give one of them$"):
        config("--dtype", "float64", "--precision", "float32")
    cfg = config("--policy", "speculative", "--k", "auto")
    assert repr(cfg.policy) == repr(Speculative(k="auto"))


def test_a_missing_store_model_names_the_pull_command(capsys, empty_store):
    code, _, err = run_cli(["generate", "hi", "--no-pull"], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "`tokenrouter pull qwen-coder-0.5b`" in err


def test_models_lists_the_store(capsys, empty_store):
    code, out, _ = run_cli(["models"], capsys)
    assert code == 0
    assert str(empty_store) in out
    assert "missing (tokenrouter pull smollm2)" in out
    assert "group 'demo': qwen-coder-0.5b, qwen-coder-1.5b" in out


def test_module_entry_point_and_console_script():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tokenrouter", "--version"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("tokenrouter "), proc.stderr
    script = Path(sys.executable).parent / "tokenrouter"
    if script.exists():  # installed by `pip install -e .` (scripts/setup.sh)
        proc = subprocess.run([str(script), "generate"], capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and "required: prompt" in proc.stderr


# ---- generate ----------------------------------------------------------------------------------
def test_generate_json_equals_the_reference(capsys, tiny_pair):
    argv = ["generate", "The quick brown fox", "--raw", "--json", "--max-tokens", "24", *pair_args(tiny_pair)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    record = json.loads(out)  # one JSON object, nothing else on stdout
    assert set(record) >= {"text", "token_ids", "token_models", "summary", "policy", "models", "precision"}
    assert set(record["precision"]) == {"small", "large"}
    assert all(p.startswith(("float32", "bfloat16", "float64")) for p in record["precision"].values())

    from tokenrouter import ModelSpec
    from tokenrouter.engine import load_tokenizer

    prompt_ids = load_tokenizer(ModelSpec(path=tiny_pair["small"])).encode("The quick brown fox")
    ref = reference_generate(
        RStitch(tau=TINY_PAIR_TAU),
        load_reference_models(tiny_pair, torch.float64),
        prompt_ids,
        SamplingParams(temperature=0, max_tokens=24),
    )
    assert record["token_ids"] == ref.token_ids
    assert record["token_models"] == ref.token_models
    assert {"small", "large"} <= set(record["token_models"])  # both models wrote tokens
    s = record["summary"]
    assert s["tokens"] == len(ref.token_ids)
    assert s["tokens_per_model"] == {m: ref.token_models.count(m) for m in ("small", "large")}
    assert s["handoffs"] == ref.num_handoffs
    assert s["tokens_per_second"] > 0


def test_generate_prints_plain_text_then_the_summary(capsys, tiny_pair):
    argv = ["generate", "def add(a, b):", "--max-tokens", "12", *pair_args(tiny_pair)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "\033[" not in out  # not a terminal: no colour codes
    text, summary = out.rstrip("\n").rsplit("\n", 1)
    assert summary.startswith("[small ") and " · large " in summary and "hand-offs" in summary
    assert "tokens/s" in summary and "finish: length" in summary
    assert "loaded in" in err  # progress goes to stderr, the answer to stdout
    for name in ("small", "large"):  # then what each model computes in, and its linear layers' kernels
        assert re.search(rf"^  {name}: (float32|bfloat16|float64)\b.*; linear: \S+$", err, flags=re.M), err


def test_generate_colours_each_models_tokens_on_a_terminal(capsys, tiny_pair, monkeypatch):
    monkeypatch.setattr(cli.output, "use_colour", lambda args: True)
    argv = ["generate", "def add(a, b):", "--max-tokens", "16", "--json", *pair_args(tiny_pair)]
    _, out, _ = run_cli(argv, capsys)
    record = json.loads(out)  # --json is never coloured
    argv.remove("--json")
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    small, large = cli.COLOURS[0], cli.COLOURS[1]
    models_seen = set(record["token_models"])
    assert (small in out) == ("small" in models_seen) and (large in out) == ("large" in models_seen)
    plain = out
    for code_ in (small, large, cli.DIM, cli.RESET):
        plain = plain.replace(code_, "")
    assert plain.startswith(record["text"])


def test_generate_reads_the_prompt_from_stdin(capsys, tiny_pair, monkeypatch):
    argv = ["generate", "-", "--json", "--max-tokens", "8", *pair_args(tiny_pair)]
    code, out, _ = run_cli(argv, capsys, stdin="for i in range(10):", monkeypatch=monkeypatch)
    assert code == 0
    argv[1] = "for i in range(10):"
    _, same, _ = run_cli(argv, capsys)
    assert json.loads(out)["token_ids"] == json.loads(same)["token_ids"]


def test_single_policy_uses_one_model(capsys, tiny_pair):
    argv = ["generate", "hi", "--policy", "single", "--model", f"m={tiny_pair['large']}", "--json", "--max-tokens", "5"]
    code, out, _ = run_cli([*argv, "--threads", "1"], capsys)
    assert code == 0
    record = json.loads(out)
    assert record["token_models"] == ["m"] * 5 and record["summary"]["handoffs"] == 0


@pytest.mark.parametrize(
    "argv, policy",
    [
        (["--policy", "speculative", "--k", "2"], "Speculative(k=2, draft='small', target='large')"),
        (["--policy", "bild", "--fallback", "0.5", "--rollback", "3"], "BiLD(fallback=0.5, rollback=3.0,"),
    ],
)
def test_generate_with_speculative_and_bild(argv, policy, capsys, tiny_pair):
    argv = ["generate", "def add(a, b):", "--json", "--max-tokens", "6", "--precision", "float32", *argv]
    code, out, err = run_cli([*argv, *pair_args(tiny_pair)[:3]], capsys)  # no --tau: it is RStitch's
    assert code == 0, err
    record = json.loads(out)
    assert record["policy"].startswith(policy)
    assert len(record["token_ids"]) == 6 and set(record["token_models"]) <= {"small", "large"}
    assert set(record["precision"]) == {"small", "large"}
    assert all(p.startswith("float32 (as asked; CPU level ") for p in record["precision"].values()), record["precision"]


# ---- chat --------------------------------------------------------------------------------------
def test_chat_keeps_the_conversation_until_reset(capsys, tiny_pair, monkeypatch):
    turns = "hello\n\nhow are you?\n/reset\nhello\n/exit\nnever read\n"
    argv = ["chat", "--max-tokens", "6", *pair_args(tiny_pair)]
    code, out, err = run_cli(argv, capsys, stdin=turns, monkeypatch=monkeypatch)
    assert code == 0, err
    *answers, rest = re.split(r"^\[small [^\n]*\]\n", out, flags=re.M)  # each answer ends with its summary
    assert len(answers) == 3 and rest == ""
    assert answers[0] == answers[2]  # after /reset, the same first turn gets the same (greedy) answer
    assert "conversation forgotten" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_cuda_device_without_cuda_is_a_usage_error(capsys, empty_store):
    code, out, err = run_cli(["generate", "hi", "--device", "cuda:0"], capsys)
    assert code == 2 and out == ""
    assert "--device cuda:0: CUDA is not available here" in err and err.count("\n") == 1
