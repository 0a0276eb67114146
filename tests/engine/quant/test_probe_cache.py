"""Timed probes that do not lie for good (engine/quant/probe_cache.py): each is kept with
the load it ran under, measured again where that load was high or its timings are implausible,
the best time per kernel and size kept over the runs, and trusted after MAX_RUNS whatever they
say; `tokenrouter models --probes` lists them and `--clear-probes` removes them."""

from __future__ import annotations

import contextlib
import json

import pytest

from tokenrouter import cli
from tokenrouter.engine.quant import probe_cache

QUIET = {"float32": {1: 2.6, 4: 2.3, 16: 3.4}, "bfloat16": {1: 0.8, 4: 1.0, 16: 1.5}}
# what a probe cached during a busy minute read ("bfloat16 0.77x at 1, 0.31x at 4, 7.07x at 16 rows")
BUSY = {"float32": {1: 2.6, 4: 2.3, 16: 24.0}, "bfloat16": {1: 3.4, 4: 7.4, 16: 3.4}}


def test_implausible_timings_are_named():
    assert probe_cache.implausible(QUIET) is None
    assert "float32" in probe_cache.implausible(BUSY)  # 16 rows 2.6x dearer per row than 4
    assert "faster at 4 rows than at 1" in probe_cache.implausible({"k": {1: 5.0, 4: 2.0}})
    assert probe_cache.implausible({"k": {2: 0.88, 4: 0.59}}) is None  # oneDNN's real dip at 4 rows


@contextlib.contextmanager
def loads(values: list):
    """other_load reporting `values` in turn (in CPUs)."""
    it = iter(values)

    @contextlib.contextmanager
    def fake():
        yield {"load": next(it)}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(probe_cache, "other_load", fake)
        yield


def test_a_probe_under_load_is_measured_again_and_keeps_the_best_times(tmp_path):
    info = {"what": "test"}
    path = probe_cache.probe_path("precision", info, tmp_path)
    runs = iter([{"k": {1: 3.0, 2: 4.0}}, {"k": {1: 2.0, 2: 5.0}}, {"k": {1: 9.0, 2: 9.0}}])
    calls = []

    def measure():
        calls.append(1)
        return next(runs)

    with loads([1.5, 0.0]):
        first = probe_cache.measured(path, info, measure)
        assert "1.50 CPUs" in first.problem and not first.trusted
        second = probe_cache.measured(path, info, measure)  # measured again: the first ran under load
    assert second.trusted and second.runs == 2 and second.timings == {"k": {1: 2.0, 2: 4.0}}
    assert probe_cache.measured(path, info, measure) == second and len(calls) == 2  # from the cache now
    saved = json.loads(path.read_text())
    assert saved["loads"] == [1.5, 0.0] and saved["runs"] == 2


def test_implausible_timings_are_measured_again_at_most_max_runs_times(tmp_path):
    info = {"what": "noisy"}
    path = probe_cache.probe_path("rows", info, tmp_path)
    calls = []

    def measure():
        calls.append(1)
        return {"k": {1: 5.0, 4: 1.0}}  # always implausible

    with loads([0.0] * 5):
        for _ in range(5):
            record = probe_cache.measured(path, info, measure)
    assert len(calls) == probe_cache.MAX_RUNS and record.trusted and record.problem


def test_the_load_is_what_other_processes_take(monkeypatch):
    busy = iter([100.0, 100.5])
    monkeypatch.setattr(probe_cache, "_busy_seconds", lambda: next(busy))
    times = iter([10.0, 10.0])  # this process took no CPU time
    monkeypatch.setattr(probe_cache.time, "process_time", lambda: next(times))
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(probe_cache.time, "monotonic", lambda: next(clock))
    with probe_cache.other_load() as load:
        pass
    assert load["load"] == 0.5


def test_the_models_command_lists_and_clears_the_probes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    info = {"kind": "quantized-rows", "shape": [8, 16], "threads": 2}
    with loads([0.0, 0.1]):
        probe_cache.measured(probe_cache.probe_path("rows", info, tmp_path), info, lambda: QUIET)
        probe_cache.measured(probe_cache.probe_path("precision", {"x": 1}, tmp_path), {"x": 1}, lambda: BUSY)
    assert cli.main(["models", "--probes"]) == 0
    out = capsys.readouterr().out
    assert "(2)" in out and "quantized-rows on [8, 16], 2 thread(s)" in out and "trusted" in out
    assert "to measure again: float32" in out and "bfloat16: 1=3.4ms" in out
    assert cli.main(["models", "--clear-probes"]) == 0
    assert "removed 2 probe(s)" in capsys.readouterr().out
    assert probe_cache.list_probes(tmp_path) == []
