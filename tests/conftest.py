import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# dtype="auto" on CPU measures whether bfloat16 beats float32 on this machine; the tests pin the
# answer to float32 (as on a CPU without native bf16), so that they compute alike on every machine.
# Tests of the probe and of bfloat16 ask for them explicitly.
os.environ.setdefault("TOKENROUTER_PROBE_SIMULATE", "no-native-bf16")

import pytest
import torch

torch.set_num_threads(1)

from tokenrouter.testing import build_tiny_model, build_tiny_pair, build_tokenizer  # noqa: E402

# The fixtures an application's tests get (tokenrouter_engine, ...); tests/test_pytest_plugin.py
# is the example that uses them.
pytest_plugins = ["tokenrouter.pytest_plugin"]

ARCHS = ["llama", "qwen2", "qwen3"]


def cpu_levels(lowest: str = "plain") -> list[str]:
    """The CPU levels a `cpu_levels` test runs at: this process's own (TOKENROUTER_CPU_LEVEL's, or
    the machine's), then every lower one down to `lowest`, as a CPU of that level would run it."""
    from tokenrouter.engine import native

    levels = native.cpu.LEVELS
    own = native.cpu.current().level
    return [own, *(lv for lv in reversed(levels[: levels.index(own)]) if levels.index(lv) >= levels.index(lowest))]


def pytest_generate_tests(metafunc):
    """A test marked `cpu_levels` runs once per level of `cpu_levels()` (ids cpu-avx512, cpu-avx2,
    cpu-plain): the engine's level is pinned for it (TOKENROUTER_CPU_LEVEL), so its kernels,
    probes and choices are that level's; torch's own kernels stay the process's.
    `@pytest.mark.cpu_levels(lowest="avx2")` stops above plain (the process's own level runs
    whatever it is)."""
    marker = metafunc.definition.get_closest_marker("cpu_levels")
    if marker:
        if "cpu_level" not in metafunc.fixturenames:
            metafunc.fixturenames.append("cpu_level")
        levels = cpu_levels(**marker.kwargs)
        metafunc.parametrize("cpu_level", levels, indirect=True, ids=[f"cpu-{lv}" for lv in levels])


@pytest.fixture
def cpu_level(request, monkeypatch):
    """The CPU level this test runs at (`cpu_levels` tests: pinned lower than the process's)."""
    from tokenrouter.engine import native

    level = getattr(request, "param", None) or native.cpu.current().level
    if level != native.cpu.current().level:
        monkeypatch.setenv(native.cpu.ENV, level)
    return level


@pytest.fixture(autouse=True)
def _probes_ignore_the_machines_load(monkeypatch):
    """A probe measured in a test is judged by its timings alone: what else the machine runs while
    the suite does (another test process, CI's neighbours) must not make a cached probe be
    measured again, and a test count more calls than it expects. tests/engine/quant/test_probe_cache.py
    checks the load rule itself."""
    from tokenrouter.engine.quant import probe_cache

    monkeypatch.setattr(probe_cache, "_busy_seconds", lambda: None)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, tokenizer):
    """float64 tiny models of three architectures, by arch name."""
    root = tmp_path_factory.mktemp("tiny")
    models = {
        arch: build_tiny_model(root / arch, arch, dtype=torch.float64, seed=i, tokenizer=tokenizer)
        for i, arch in enumerate(ARCHS)
    }
    # Sliding-window attention (every layer attends to the last 8 positions only).
    models["mistral-sliding"] = build_tiny_model(
        root / "mistral", "mistral", dtype=torch.float64, seed=5, tokenizer=tokenizer, sliding_window=8
    )
    return models


@pytest.fixture(scope="session")
def tiny_model(tiny_models):
    return tiny_models["qwen2"]


# With logit_scale=3 the tiny pair's normalized entropies straddle 0.2 (both directions often).
TINY_PAIR_TAU = 0.2


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tokenizer):
    """Two float64 Qwen2 models sharing one tokenizer, for routing: {"small": dir, "large": dir}."""
    return build_tiny_pair(tmp_path_factory.mktemp("pair"), tokenizer=tokenizer)


# ---- Ray: a local cluster of two simulated nodes, for the tests of models in Ray actors -----------
SMALL_NODE, LARGE_NODE = {"node_small": 8}, {"node_large": 8}  # custom resources: one node each


@pytest.fixture(scope="session")
def ray_cluster():
    """A Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`): the head offers
    the resource "node_small", the other "node_large", so an actor asking for one is pinned to its
    node. This process is connected to it. Shut down when the session ends, and every process it
    started must then be gone (a test that leaves a Ray process behind fails here)."""
    import ray
    from ray.cluster_utils import Cluster

    from tests.ray_processes import descendants, wait_gone

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "resources": SMALL_NODE})
    cluster.add_node(num_cpus=4, resources=LARGE_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    yield cluster
    started = descendants()  # the cluster's processes (raylets, GCS, actors' workers), before they stop
    ray.shutdown()
    cluster.shutdown()
    left = wait_gone(started, timeout=60)
    assert not left, f"Ray processes left behind: {left}"
