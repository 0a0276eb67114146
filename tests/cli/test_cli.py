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
from tokenrouter.policies import RStitch
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
        ],
        ("chat",): ["/reset", "--policy", "--tau", "--model NAME=PATH", "--max-tokens", "--temperature", "--seed"],
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
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv, message, capsys, empty_store):
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tokenrouter"), err
    assert message in err, err


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
    assert set(record) >= {"text", "token_ids", "token_models", "summary", "policy", "models"}

    from tokenrouter import ModelSpec
    from tokenrouter.engine.model.loader import load_tokenizer

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
