"""`tokenrouter bench`: routed serving against its baselines (`systems.py`), on generated workloads.

- `workloads.py`: short reasoning, long reasoning and agentic sessions, generated from a seed and
  sized in the served model's tokens (a `gpu` and a `cpu` size), or a JSONL file of your prompts;
- `systems.py`: routed, standard, standard+pc and lockstep (`Engine(mode=...)`);
- `harness.py`: runs each system on the same models, prompts, concurrency levels and KV budget;
- `metrics.py`: what a run records, and medians over repeats;
- `report.py`: results.json, a markdown table per workload, plot.png.
"""

from .harness import BenchConfig, BenchError, BenchResult, measure, run_bench
from .metrics import Run, Summary, Turn
from .report import markdown, plot, write_report
from .systems import SYSTEMS, System
from .workloads import BUILT_IN, SIZES, Session, Sizes, WorkloadSpec, read_prompts, workload

__all__ = [
    "BUILT_IN",
    "SIZES",
    "SYSTEMS",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "Run",
    "Session",
    "Sizes",
    "Summary",
    "System",
    "Turn",
    "WorkloadSpec",
    "markdown",
    "measure",
    "plot",
    "read_prompts",
    "run_bench",
    "workload",
    "write_report",
]
