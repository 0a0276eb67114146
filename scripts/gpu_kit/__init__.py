"""The GPU kit (docs/gpu.md): build the wheel set on a CPU machine, check it there, run the GPU-side stages.

Run as `python -m scripts.gpu_kit COMMAND` from the repository root (cli.py lists the commands). A module a
concept, by what it does:

  build, on a CPU machine    trim (repack flashinfer), probe (flashinfer's JIT specs in a process of their
                             own), include_closure, jit_modules (the kernels we need), wheel_files, lists
  checks, on a CPU machine   completeness (`complete`), wheel_set_check (`verify-wheels`), resolver_check
                             (`resolve`), trimmed_check (`check-trimmed`), travel_size (`travel-size`)
  stages, on the GPU         preflight, env_check (`check-env`), nvcc_jobs (`max-jobs`), warm (jit-fa2,
                             jit-fa3)
  report                     jit_report (`jit-report`), summary (summary.json and the stage times)

Every module imports only the standard library at its top: check-env and summary run before anything is
installed.
"""
