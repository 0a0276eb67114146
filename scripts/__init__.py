"""The repository's tools. A package, so that `python -m scripts.gpu_kit` from the repository root finds the
GPU kit there before any other `scripts` on the path."""
