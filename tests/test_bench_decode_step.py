"""benchmarks/kernels/bench_decode_step.py (issue 53, the GPU kit's decode-step micro-benchmark), on a tiny random
pair on CPU, in a subprocess as the kit runs it: decode.json holds every (model, B, mode), the graph mode
skipped with its reason, positive times against a positive floor, and the engine's eager step computing
the same greedy tokens as transformers' own step on the same context (float32: within 1e-3 in logits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "kernels" / "bench_decode_step.py"


def test_the_decode_step_benchmark_on_a_tiny_pair_on_cpu(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--random-weights", "--tiny", "--device", "cpu", "--dtype", "float32"]
    cmd += ["--batch", "1", "2", "--steps", "2", "--threads", "1", "--out", str(tmp_path)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "decode.json").read_text())
    assert result["complete"] and result["device"] and result["torch"] and result["transformers"]
    assert result["copy_bandwidth"]["gb_per_s"] > 0
    assert set(result["models"]) == {"small", "large"}
    for shapes in result["models"].values():
        assert shapes["weight_bytes"] >= shapes["floor_bytes"] > 0 and shapes["num_hidden_layers"] > 0
    runs = {(m["model"], m["batch"], m["mode"]): m for m in result["measurements"]}
    assert set(runs) == {(m, b, mode) for m in ("small", "large") for b in (1, 2) for mode in ("graph", "eager", "hf")}
    for (model, b, mode), m in runs.items():
        assert m["floor_ms"] > 0
        if mode == "graph":
            assert "CUDA" in m["skipped"] and "ms" not in m
            continue
        assert len(m["times_ms"]) == 2 and min(m["times_ms"]) > 0
        assert m["ms"] > 0 and abs(m["x_floor"] - m["ms"] / m["floor_ms"]) < 1e-9
        if mode == "eager":
            assert m["vs_hf"]["rows"] == b
            assert m["vs_hf"]["argmax_agree"] == b, (model, b, m["vs_hf"])
            assert m["vs_hf"]["max_abs_logit_diff"] < 1e-3, (model, b, m["vs_hf"])
    table = done.stdout[done.stdout.index("model ") :]
    assert table.count("skipped") == 4 and "floor ms" in table
