"""`tokenrouter bench`: routed serving against its baselines (`systems.py`), on generated workloads.

- `workloads.py`: short reasoning, long reasoning, agentic sessions and agentic edits, generated
  from a seed and sized in the served model's tokens (a `gpu` and a `cpu` size); `questions.py`,
  `agentic.py` and `edits.py` write their prompts, `prompt_file.py` reads a JSONL file of yours
  instead;
- `sessions.py`: a session (one client's turns) and its size in tokens;
- `systems.py`: routed, standard, standard+pc and lockstep (`Engine(mode=...)`);
- `settings.py`: a run's configuration (`BenchConfig`), checked before anything loads;
- `harness.py`: runs each system on the same models, prompts, concurrency levels and KV budget;
- `engines.py`: opening, warming, draining and releasing each system's engine;
- `closed_loop.py`: one measured run, C sessions in flight;
- `metrics.py`: what a run records, and medians over repeats;
- `results.py`: every run and its medians, with what produced them (`BenchResult`);
- `report.py`: results.json, a markdown table per workload, plot.png.
"""

from .closed_loop import measure
from .engines import release_memory, wait_free
from .harness import run_bench
from .machine import machine_info
from .metrics import Run, Summary, Turn, percentile
from .prompt_file import read_prompts
from .report import markdown, plot, pyplot, save_figure, write_report, write_table_and_plot
from .results import BenchResult
from .sessions import Session, Sizes
from .settings import BenchConfig, BenchError
from .systems import SYSTEMS, System
from .workloads import BUILT_IN, DEFAULT_WORKLOADS, SESSION_WORKLOADS, SIZES, WorkloadSpec, workload

__all__ = ["BUILT_IN", "SIZES", "SYSTEMS", "BenchConfig", "BenchError", "BenchResult", "Run", "Session", "Sizes"]
__all__ += ["Summary", "System", "Turn", "WorkloadSpec", "markdown", "measure", "plot", "read_prompts", "run_bench"]
__all__ += ["workload", "write_report", "machine_info", "percentile", "pyplot", "release_memory", "save_figure"]
__all__ += ["wait_free", "write_table_and_plot", "DEFAULT_WORKLOADS", "SESSION_WORKLOADS"]
