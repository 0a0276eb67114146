"""`tokenrouter bench`: workloads from a seed, sized as documented; the prompts file's errors; the
harness on the tiny pair with all six systems (same tokens, consistent counts, a run cut short
frees every KV block); the report (JSON, markdown, PNG); the CLI (`--quick`, bad arguments).

One test runs `tokenrouter bench --quick` on the real demo pair when it is in the store.
"""

from __future__ import annotations

import json
import sys
import time

import anyio
import pytest
import torch

from tests.cli.test_cli import run_cli
from tests.conftest import TINY_PAIR_TAU
from tests.helpers import holds_nothing, wait_all_free
from tokenrouter import Engine, ModelSpec, RStitch, store
from tokenrouter.bench import (
    SIZES,
    SYSTEMS,
    BenchConfig,
    BenchError,
    markdown,
    measure,
    read_prompts,
    run_bench,
    workload,
    write_report,
)
from tokenrouter.bench.sessions import PROMPT_TOKENS
from tokenrouter.errors import ConfigError


def chat_tokens(tokenizer, messages) -> int:
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


# ---- workloads ---------------------------------------------------------------------------------
def test_sizes_are_the_documented_ones():
    assert SIZES["short"]["gpu"].max_tokens == 2048 and SIZES["short"]["cpu"].max_tokens == 16
    assert SIZES["long"]["gpu"].max_tokens == 8192 and SIZES["long"]["cpu"].max_tokens == 64
    gpu, cpu = SIZES["agentic"]["gpu"], SIZES["agentic"]["cpu"]
    assert (gpu.max_tokens, gpu.history_tokens, gpu.turns) == (1024, 8192, 4)
    assert (cpu.max_tokens, cpu.history_tokens, cpu.turns) == (16, 128, 2)


@pytest.mark.parametrize("name", ["short", "long", "agentic", "agentic-edit"])
def test_workloads_are_deterministic_from_the_seed(name, tokenizer):
    spec = workload(name, "cpu")
    a = spec.build(tokenizer, 5, seed=3, level=4)
    assert a == spec.build(tokenizer, 5, seed=3, level=4)
    assert a != spec.build(tokenizer, 5, seed=4, level=4)
    assert a != spec.build(tokenizer, 5, seed=3, level=1)  # each level draws its own prompts


@pytest.mark.parametrize("name, size", [("short", "cpu"), ("long", "cpu"), ("short", "tiny")])
def test_questions_are_sized_as_documented(name, size, tokenizer):
    top = SIZES[name][size].max_tokens
    lo, hi = PROMPT_TOKENS if size != "tiny" else (30, 50)
    sessions = workload(name, size).build(tokenizer, 40, seed=0)
    for s in sessions:
        assert s.turns == 1 and len(s.messages) == 1 and s.messages[0]["role"] == "user"
        n = chat_tokens(tokenizer, s.messages)
        assert n == s.prompt_tokens and lo <= n <= hi
        assert top // 4 <= s.max_tokens[0] <= top
    if size == "cpu":  # (at 30-50 tokens the tiny tokenizer fits few templates)
        assert len({s.messages[0]["content"] for s in sessions}) == len(sessions)
    assert len({s.max_tokens[0] for s in sessions}) >= min(5, top - top // 4 + 1)  # lengths are drawn, not fixed


@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_agentic_sessions_are_sized_as_documented(size, tokenizer):
    sizes = SIZES["agentic"][size]
    sessions = workload("agentic", size).build(tokenizer, 3 if size == "cpu" else 2, seed=0)
    system = sessions[0].messages[0]
    for s in sessions:
        assert s.messages[0] == system and system["role"] == "system"  # one shared system prompt
        assert chat_tokens(tokenizer, [system]) >= sizes.history_tokens // 4
        n = chat_tokens(tokenizer, s.messages)
        assert n == s.prompt_tokens and sizes.history_tokens <= n <= 1.05 * sizes.history_tokens + 8
        assert s.turns == sizes.turns and s.max_tokens == [sizes.max_tokens] * sizes.turns
        assert len(s.followups) == sizes.turns - 1
        for f, k in zip(s.followups, s.followup_tokens):  # about history/8 tokens of tool output each
            assert k == len(tokenizer.encode(f, add_special_tokens=False))
            assert sizes.history_tokens // 8 <= k <= 1.05 * (sizes.history_tokens // 8) + 16
        tools = "\n".join(m["content"] for m in s.messages[2:])
        assert any(w in tools for w in ("$ ls -la", "$ pytest", "$ cat "))
    assert len({s.messages[1]["content"] + s.messages[-1]["content"] for s in sessions}) == len(sessions)


@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_agentic_edit_sessions_quote_a_file_and_ask_for_it_back(size, tokenizer):
    """Each session quotes whole functions of this package's own code (at least the size's
    history, or a whole module) and a grep of the function to rename, and asks for the file back,
    all in one user message (no assistant turns calling tools: a model answers those with another
    tool call); the later turns ask for it again with another edit. Not run by default."""
    from tokenrouter.bench import DEFAULT_WORKLOADS

    assert "agentic-edit" not in DEFAULT_WORKLOADS
    sizes = SIZES["agentic-edit"][size]
    sessions = workload("agentic-edit", size).build(tokenizer, 4, seed=0)
    for s in sessions:
        assert s.turns == sizes.turns and s.max_tokens == [sizes.max_tokens] * sizes.turns
        assert chat_tokens(tokenizer, s.messages) == s.prompt_tokens
        assert [m["role"] for m in s.messages] == ["system", "user"]
        quoted, rest = s.messages[1]["content"].split("```\n\n")
        grep, task = rest.split("\n\n")
        path, old = task.split()[1].rstrip(","), task.split("`")[1]
        assert quoted.startswith(f"$ cat {path}\n```python\n") and f"def {old}(" in quoted
        assert len(tokenizer.encode(quoted, add_special_tokens=False)) >= min(sizes.history_tokens, 40)
        assert grep.startswith(f"$ grep -n '{old}' {path}") and "whole edited file" in task
        assert len(s.followups) == sizes.turns - 1 and all("whole file again" in f for f in s.followups)
    assert len({s.messages[1]["content"] for s in sessions}) > 1


def test_every_size_can_be_overridden(tokenizer):
    spec = workload("agentic", "cpu", max_tokens=5, history_tokens=100, turns=2)
    (s,) = spec.build(tokenizer, 1)
    assert s.max_tokens == [5, 5] and 100 <= s.prompt_tokens <= 125 and len(s.followups) == 1
    assert workload("short", "gpu", max_tokens=12).sizes.max_tokens == 12
    with pytest.raises(ConfigError, match="turns: only the agentic workload"):
        workload("short", "cpu", turns=2)
    with pytest.raises(ConfigError, match="max_tokens: must be an integer >= 1"):
        workload("long", "cpu", max_tokens=0)
    with pytest.raises(ConfigError, match="unknown 'huge'"):
        workload("huge")


def test_a_prompts_file_is_read_in_order(tmp_path, tokenizer):
    f = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "Write a haiku about KV caches."},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 7},
        {"prompt": "Reuse a label corpus", "response": "its response is ignored"},
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")
    spec = read_prompts(f, max_tokens=20)
    sessions = spec.build(tokenizer, 4)  # cycled
    assert [s.max_tokens for s in sessions] == [[20], [7], [20], [20]]
    assert sessions[0].messages == [{"role": "user", "content": lines[0]["prompt"]}]
    assert sessions[1].messages == lines[1]["messages"]
    assert sessions[1].prompt_tokens == chat_tokens(tokenizer, lines[1]["messages"])
    assert "3 prompts from" in spec.describe()


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", 'expected an object with "prompt" or "messages"'),
        ('{"prompt": 3}', 'field "prompt" must be a string'),
        ('{"prompt": "   "}', 'field "prompt" is empty'),
        ('{"prompt": "a\\u0000b"}', 'field "prompt" contains a NUL'),
        ('{"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}', 'exactly one of "prompt"'),
        ('{"max_tokens": 3}', 'exactly one of "prompt"'),
        ('{"messages": "hi"}', 'field "messages" must be a list of chat messages'),
        ('{"messages": []}', 'field "messages" is an empty list'),
        ('{"messages": [{"role": "robot", "content": "x"}]}', 'field "messages"[0].role must be one of'),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "user"}]}', 'field "messages"[1].content must be'),
        ('{"messages": ["hi"]}', 'field "messages"[0] must be an object'),
        ('{"prompt": "hi", "max_tokens": 0}', 'field "max_tokens" must be an integer >= 1, got 0'),
        ('{"prompt": "hi", "max_tokens": true}', 'field "max_tokens" must be an integer >= 1, got true'),
        ('{"prompt": "hi", "max_tokens": "8"}', 'field "max_tokens" must be an integer >= 1, got "8"'),
        ('{"prompt": "hi", "max_token": 8}', "unknown field 'max_token'"),
    ],
)
def test_a_bad_prompts_line_names_the_line_and_the_field(line, message, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(ConfigError) as e:
        read_prompts(f, max_tokens=8)
    assert f"{f}:3: " in str(e.value) and message in str(e.value), str(e.value)


def test_an_empty_or_missing_prompts_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n \n")
    with pytest.raises(ConfigError, match="no prompts"):
        read_prompts(tmp_path / "empty.jsonl", 8)
    with pytest.raises(ConfigError, match="no such file"):
        read_prompts(tmp_path / "missing.jsonl", 8)


# ---- the harness on the tiny pair --------------------------------------------------------------
def tiny_config(pair, **kw) -> BenchConfig:
    settings = {
        "models": pair,
        "policy": RStitch(tau=TINY_PAIR_TAU),
        "workloads": [workload("short", "tiny", max_tokens=8), workload("agentic", "tiny", max_tokens=6)],
        "concurrency": [1, 3],
        "repeats": 1,
        "min_requests": 2,
        "threads": 1,
        "threads_lockstep": 1,
        "dtype": "float64",
    }
    settings.update(kw)
    return BenchConfig(**settings)


@pytest.fixture(scope="module")
def tiny_result(tiny_pair, tokenizer):
    """All six systems, both kinds of workload, two levels; a fresh engine per run."""
    lines = []
    result = anyio.run(lambda: run_bench(tiny_config(tiny_pair), tokenizer, command="test", progress=lines.append))
    return result, lines


def test_every_routing_system_writes_the_same_tokens(tiny_result):
    result, lines = tiny_result
    assert len(result.runs) == 2 * 2 * 6 and len(lines) == 1 + len(result.runs)  # a header, then a line per run
    assert lines[0].startswith("bench: 24 runs: short, agentic x C 1 3")
    assert [(s.workload, s.concurrency, s.system) for s in result.summaries] == [
        (w, c, s) for w in ("short", "agentic") for c in (1, 3) for s in SYSTEMS
    ]
    routing = [s for s in result.summaries if SYSTEMS[s.system].alone is None]
    assert all(s.same_tokens_as_routed is True for s in routing), result.warnings
    assert all(s.same_tokens_as_routed is None for s in result.summaries if s not in routing)
    for alone, model in (("small", "small"), ("large", "large")):  # one model writes every token
        runs = [r for r in result.runs if r.system == alone]
        assert runs and all(set(r.metrics()["tokens_by_model"]) == {model} for r in runs)
        assert all(r.metrics()["handoffs"] == 0 for r in runs)
    assert result.warnings == []
    assert sum(r.metrics()["handoffs"] for r in result.runs if r.system == "routed") > 0


def test_counts_are_consistent(tiny_result, tokenizer):
    result, _ = tiny_result
    for r in result.runs:
        m = r.metrics()
        sessions = (
            tiny_config({})
            .workloads[0 if r.workload == "short" else 1]
            .build(tokenizer, max(2, r.concurrency), level=r.concurrency)
        )
        # EOS is ignored: every request writes exactly its max_tokens, and the models' tokens add up
        assert m["output_tokens"] == sum(sum(s.max_tokens) for s in sessions)
        assert sum(m["tokens_by_model"].values()) == m["output_tokens"]
        assert m["requests_completed"] == m["requests_total"] == sum(s.turns for s in sessions)
        assert not r.cut_short and r.kv_freed
        assert m["tok_per_s"] > 0 and 0 < m["ttft_p50_s"] <= m["p50_s"] <= m["p99_s"] <= r.wall_s
        models = {"small": ["small"], "large": ["large"]}.get(r.system, ["small", "large"])
        assert all(m["tokens_processed"][x] > 0 for x in models)
    processed = {
        s.system: sum(s.metrics["tokens_processed"].values())
        for s in result.summaries
        if (s.workload, s.concurrency) == ("short", 3)
    }
    assert processed["standard"] > processed["routed"]  # every hand-off re-prefills the whole sequence
    # agentic turns share a growing prefix: with prefix caching the second turn finds the first's blocks
    routed = next(r for r in result.runs if (r.workload, r.concurrency, r.system) == ("agentic", 1, "routed"))
    standard = next(r for r in result.runs if (r.workload, r.concurrency, r.system) == ("agentic", 1, "standard"))
    assert routed.prefix_cache_hit_tokens["small"] > 0 and sum(standard.prefix_cache_hit_tokens.values()) == 0


def test_the_report_writes_json_markdown_and_a_png(tiny_result, tmp_path):
    result, _ = tiny_result
    written, notes = write_report(result, tmp_path / "out")
    assert notes == []
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(data) >= {"command", "machine", "models", "policy", "settings", "workloads", "summaries", "runs"}
    assert len(data["runs"]) == len(result.runs) and data["runs"][0]["turns"][0]["latency_s"] > 0
    assert data["settings"]["kv_cache_tokens"] >= 8192 and data["machine"]["cpu_count"] >= 1
    assert data["summaries"][0]["same_tokens_as_routed"] is True
    md = (tmp_path / "out" / "results.md").read_text()
    assert md == markdown(result)
    assert md.count("| C | system | output tok/s | x standard+pc | x large | x lockstep |") == 2
    assert "### short:" in md and "### agentic:" in md and "tokens small/large" in md
    assert (tmp_path / "out" / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(written) == {"json", "markdown", "plot"}


def test_without_matplotlib_the_plot_is_skipped_with_a_note(tiny_result, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    written, notes = write_report(tiny_result[0], tmp_path)
    assert "plot" not in written and not (tmp_path / "plot.png").exists()
    assert len(notes) == 1 and "pip install 'tokenrouter[bench]'" in notes[0]


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_a_run_cut_short_cancels_cleanly_and_frees_every_block(system, tiny_pair, tokenizer):
    s = SYSTEMS[system]
    # 32 requests of 90-360 tokens, 2 in flight: at least ~1,500 steps, several seconds even on a
    # fast machine, so the 0.4 s cap always cuts the run (4 requests once finished in 0.36 s)
    sessions = workload("short", "cpu", max_tokens=360).build(tokenizer, 32)

    async def main():
        specs = {
            m: ModelSpec(path=p, dtype="float64", kv_cache_tokens=4096, enable_prefix_caching=s.prefix_caching)
            for m, p in tiny_pair.items()
        }
        specs, policy = s.serves(RStitch(tau=TINY_PAIR_TAU), specs)
        async with Engine(models=specs, policy=policy, mode=s.mode, num_threads=1) as engine:
            t0 = time.perf_counter()
            run = await measure(engine, sessions, 2, max_run_s=0.4, workload="short", system=system)
            took = time.perf_counter() - t0
            await wait_all_free(engine)
            assert holds_nothing(engine)
            return run, took

    run, took = anyio.run(main)
    m = run.metrics()
    assert run.cut_short and run.kv_freed
    assert 0.4 <= run.wall_s < 5.0 and took < 20  # cut_short is the check; these bound a hang, loosely (2 loaded cores)
    assert m["requests_completed"] < m["requests_total"] <= 32  # some were still in flight
    assert m["output_tokens"] > 0 and m["tok_per_s"] == m["output_tokens"] / run.wall_s
    assert all(t.latency_s is None for t in run.turns if not t.completed)


def test_a_cut_short_run_is_marked_in_the_table(tiny_pair, tokenizer):
    cfg = tiny_config(
        tiny_pair,
        workloads=[workload("long", "cpu", max_tokens=300)],
        concurrency=[2],
        systems=["routed"],
        max_run_s=0.3,
        reuse_engines=True,
    )
    result = anyio.run(lambda: run_bench(cfg, tokenizer))
    (summary,) = result.summaries
    assert summary.cut_short and result.runs[0].kv_freed
    md = markdown(result)
    assert "†" in md.split("\n| 2 | routed |")[1].split("\n")[0] and "cut short by --max-run-s" in md


def test_a_reused_engine_starts_every_run_cold(tiny_pair, tokenizer):
    """Reusing an engine across repeats must not let repeat 2 hit repeat 1's prompts (C = 1: the
    hits within a run, session 2 on session 1's system prompt, do not depend on timing)."""
    cfg = tiny_config(
        tiny_pair,
        workloads=[workload("agentic", "tiny", max_tokens=4)],
        concurrency=[1],
        requests=2,
        systems=["routed", "standard+pc"],
        repeats=2,
        reuse_engines=True,
    )
    result = anyio.run(lambda: run_bench(cfg, tokenizer))
    for system in cfg.systems:
        first, second = [r for r in result.runs if r.system == system]
        assert first.prefix_cache_hit_tokens == second.prefix_cache_hit_tokens, system
        assert first.metrics()["output_tokens"] == second.metrics()["output_tokens"]


def test_order_levels_runs_every_system_at_a_level_first_and_checkpoints(tiny_pair, tokenizer, monkeypatch):
    """The GPU kit's order: level-major, every system's engine loaded once, and a result after each run
    (what a run killed midway leaves behind)."""
    import tokenrouter.bench.harness as harness

    opened = []
    real_open = harness.open_engine

    async def counting_open(cfg, system, kv):
        opened.append(system)
        return await real_open(cfg, system, kv)

    monkeypatch.setattr(harness, "open_engine", counting_open)
    cfg = tiny_config(
        tiny_pair,
        workloads=[workload("short", "tiny", max_tokens=2)],
        concurrency=[2, 1],
        requests=2,
        systems=["routed", "large"],
        reuse_engines=True,
        order="levels",
    )
    seen = []
    result = anyio.run(lambda: run_bench(cfg, tokenizer, checkpoint=lambda r: seen.append(r)))
    assert [(r.concurrency, r.system) for r in result.runs] == [
        (2, "routed"),
        (2, "large"),
        (1, "routed"),
        (1, "large"),
    ]
    assert opened == ["routed", "large"]
    assert [len(r.runs) for r in seen] == [1, 2, 3, 4]
    assert [(s.concurrency, s.system) for s in seen[1].summaries] == [(2, "routed"), (2, "large")]
    assert result.settings["order"] == "levels"
    with pytest.raises(ConfigError, match="order: 'rounds' or 'levels'"):
        tiny_config(tiny_pair, order="columns").check()


def test_model_options_reach_every_system_that_loads_the_model(tiny_pair):
    from tokenrouter.bench.engines import open_engine

    cfg = tiny_config(tiny_pair, systems=["routed", "large"], model_options={"large": {"block_size": 8}})
    cfg.check()

    async def block_sizes(system: str) -> dict:
        engine = await open_engine(cfg, system, 1024)
        try:
            return {name: model.spec.block_size for name, model in engine.info().models.items()}
        finally:
            await engine.close()

    assert anyio.run(lambda: block_sizes("routed")) == {"small": 16, "large": 8}
    assert anyio.run(lambda: block_sizes("large")) == {"large": 8}
    with pytest.raises(ConfigError, match="model_options: 'medium' is not one of the models"):
        tiny_config(tiny_pair, model_options={"medium": {"block_size": 8}}).check()


def test_a_kv_budget_too_small_is_refused_before_loading(tiny_pair, tokenizer):
    cfg = tiny_config(tiny_pair, kv_cache_tokens=64)
    with pytest.raises(BenchError, match="kv_cache_tokens: 64 is too small.*raise --kv-cache-tokens"):
        anyio.run(lambda: run_bench(cfg, tokenizer))


# ---- the CLI -----------------------------------------------------------------------------------
def test_bench_help_is_complete(capsys):
    code, out, _ = run_cli(["bench", "--help"], capsys)
    assert code == 0
    for word in [
        "--workload",
        "--prompts FILE.jsonl",
        "--size",
        "--concurrency",
        "--systems",
        "--repeats",
        "--requests",
        "--max-tokens",
        "--history-tokens",
        "--turns",
        "--max-run-s",
        "--kv-cache-tokens",
        "--threads",
        "--threads-lockstep",
        "--seed",
        "--policy",
        "--tau",
        "--model NAME=PATH",
        "--out DIR",
        "--quick",
        "routed",
        "standard+pc",
        "lockstep",
        "results.json",
        "plot.png",
    ]:
        assert word in out, word


def test_bench_quick_on_the_tiny_pair(tiny_pair, tmp_path, capsys):
    out_dir = tmp_path / "quick"
    argv = [
        "bench",
        "--quick",
        f"--model=small={tiny_pair['small']}",
        f"--model=large={tiny_pair['large']}",
        f"--tau={TINY_PAIR_TAU}",
        "--threads-lockstep=1",
        "--out",
        str(out_dir),
    ]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("### ")] == [
        "### short",
        "### long",
        "### agentic",
    ]
    assert err.count(" tok/s") == 3 * 2 * len(SYSTEMS)  # one progress line per run on stderr
    assert f"to {out_dir}" in err
    data = json.loads((out_dir / "results.json").read_text())
    s = data["settings"]
    assert (s["concurrency"], s["repeats"], s["systems"], s["reuse_engines"]) == ([1, 3], 1, list(SYSTEMS), True)
    assert data["workloads"]["long"]["sizes"]["max_tokens"] == 6
    assert data["workloads"]["agentic"]["sizes"] == {"max_tokens": 4, "history_tokens": 48, "turns": 2}
    assert data["workloads"]["short"]["sizes"] == {"max_tokens": 4, "prompt_tokens": [30, 50]}
    assert data["workloads"]["short"]["levels"]["1"]["sessions"] == 1  # --quick: C requests per level
    assert data["command"].startswith("tokenrouter bench --quick")
    assert (out_dir / "results.md").read_text() == out and (out_dir / "plot.png").stat().st_size > 0


def test_bench_runs_a_prompts_file(tiny_pair, tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def add(a, b):", "max_tokens": 5}\n{"prompt": "The quick brown fox"}\n')
    argv = [
        "bench",
        "--prompts",
        str(f),
        "--systems",
        "routed",
        "lockstep",
        "--concurrency",
        "2",
        "--repeats",
        "1",
        "--requests",
        "2",
        "--max-tokens",
        "4",
        f"--model=small={tiny_pair['small']}",
        f"--model=large={tiny_pair['large']}",
        "--tau=0.2",
        "--threads-lockstep=1",
        "--out",
        str(tmp_path / "o"),
    ]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "### prompts: 2 prompts from" in out and "| 2 | lockstep |" in out
    runs = json.loads((tmp_path / "o" / "results.json").read_text())["runs"]
    assert [r["output_tokens"] for r in runs] == [9, 9]


COUNT_FLAGS = (
    "--concurrency",
    "--repeats",
    "--requests",
    "--max-tokens",
    "--history-tokens",
    "--kv-cache-tokens",
    "--threads-lockstep",
)
CHOICE_FLAGS = {"--workload": "huge", "--systems": "vllm", "--size": "xl"}


@pytest.mark.parametrize(
    "argv, message",
    [
        *[([flag, bad], f"{flag}: must be >= 1, got {bad}") for flag in COUNT_FLAGS for bad in ("0", "-1")],
        *[([flag, "2.5"], f"{flag}: expected an integer, got '2.5'") for flag in COUNT_FLAGS],
        *[([flag, bad], f"{flag}: invalid choice: '{bad}'") for flag, bad in CHOICE_FLAGS.items()],
        (["--max-run-s", "0"], "--max-run-s: must be a positive number of seconds"),
        (["--max-run-s", "soon"], "--max-run-s: expected a number of seconds"),
        (["--workload", "short", "--turns", "3"], "--turns is only for the agentic workload"),
        (["--workload", "long", "--history-tokens", "64"], "--history-tokens is only for the agentic workload"),
        (["--prompts", "/no/such.jsonl"], "--prompts: /no/such.jsonl: no such file"),
        (["--device", "nonsense"], "--device: not a torch device"),
        (["--tau", "2"], "--tau must be in [0, 1], got 2.0"),
        (["--model", "small=/no/such/dir"], "--model small=/no/such/dir: no such file or directory"),
        (["--model", "huge=."], "the rstitch policy names its models ['small', 'large']"),
    ],
)
def test_bad_bench_arguments_give_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "store"))  # an empty store: nothing is fetched
    code, out, err = run_cli(["bench", "--no-pull", *argv], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tokenrouter"), err
    assert message in err, err


def test_bench_argument_errors_that_need_files(tiny_pair, tmp_path, capsys):
    pair = [f"--model=small={tiny_pair['small']}", f"--model=large={tiny_pair['large']}"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "x", "max_tokens": -3}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["--prompts", str(bad)], f'--prompts: {bad}:2: field "max_tokens" must be an integer >= 1, got -3'),
        (["--out", str(a_file)], "exists and is not a directory"),
        ([*pair, "--kv-cache-tokens", "100", "--quick"], "raise --kv-cache-tokens"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda: CUDA is not available"))
    for argv, message in cases:
        code, out, err = run_cli(["bench", "--no-pull", *argv], capsys)
        assert code == 2 and out == "" and err.count("\n") == 1, (argv, err)
        assert message in err, err


# ---- the real demo pair ------------------------------------------------------------------------
@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.skipif(
    not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
    reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
)
def test_bench_quick_on_the_demo_pair(tmp_path, capsys):
    """What a user runs first (about 4-5 minutes here, a third of the suite, hence slow: CI's
    `tokenrouter generate` and test_real_demo_pair keep the demo pair in every run; the time is a
    benchmark's to measure, see docs/benchmarks.md, not a test's to assert)."""
    code, out, err = run_cli(["bench", "--quick", "--no-pull", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["runs"]) == 3 * 2 * len(SYSTEMS) and all(r["kv_freed"] for r in data["runs"])
    routed = [s for s in data["summaries"] if s["system"] == "routed"]
    assert all(s["metrics"]["requests_completed"] == s["metrics"]["requests_total"] for s in data["summaries"])
    assert sum(s["metrics"]["handoffs"] for s in routed) > 0
    assert "### agentic" in out
