"""Finding a model: by path or by store name, pulled on request; and what the store holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFoundError
from .conversion import ensure_model
from .layout import COMPLETE_MARKER, gguf_path, home_dir, model_dir
from .registry import MODELS, expand


def pull(name: str, home: str | Path | None = None) -> list[Path]:
    """Fetch and convert a model or a group of models (`tokenrouter pull`); a no-op when present."""
    return [ensure_model(n, home) for n in expand(name)]


def is_pulled(name: str, home: str | Path | None = None) -> bool:
    return (model_dir(name, home) / COMPLETE_MARKER).is_file()


def pull_command(name: str) -> str:
    return f"tokenrouter pull {name}"


def locate_model(where: str | Path, *, pull: bool = False, home: str | Path | None = None) -> Path:
    """Where a model is: an existing path (a Hugging Face directory or a .gguf file) as it is,
    else the converted directory of the store model of that name, fetched now if `pull`. The one
    place a model argument is resolved; a missing store model is an error naming the command
    that fetches it, and anything else an error saying it is neither."""
    path = Path(where).expanduser()
    if path.exists():
        return path
    name = str(where)
    if name not in MODELS:
        raise ModelNotFoundError(name, f"no such file or directory, and not a store model ({', '.join(MODELS)})")
    if is_pulled(name, home):
        return model_dir(name, home)
    if pull:
        return ensure_model(name, home)
    raise ModelNotFoundError(name, f"not in the store at {home_dir(home)}; fetch it with `{pull_command(name)}`")


@dataclass(frozen=True)
class StoreEntry:
    name: str
    description: str
    pulled: bool
    size_bytes: int  # the converted directory plus the GGUF file, 0 when absent


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def list_models(home: str | Path | None = None) -> list[StoreEntry]:
    """Every registered model, whether it is in the store, and what it takes on disk (`tokenrouter models`)."""
    return [
        StoreEntry(
            name,
            source.description,
            is_pulled(name, home),
            tree_size(model_dir(name, home)) + tree_size(gguf_path(name, home)),
        )
        for name, source in MODELS.items()
    ]


def gguf_for(directory: str | Path) -> Path | None:
    """The verified GGUF a store model's directory was converted from (`<home>/gguf/<name>.gguf`,
    kept beside `<home>/models/<name>/`), or None if `directory` is not such a directory."""
    directory = Path(directory).resolve()
    gguf = directory.parent.parent / "gguf" / f"{directory.name}.gguf"
    if directory.parent.name != "models" or not (directory / COMPLETE_MARKER).is_file() or not gguf.is_file():
        return None
    source = MODELS.get(directory.name)
    marker = (directory / COMPLETE_MARKER).read_text().strip()
    return gguf if source is not None and marker == source.sha256 else None
