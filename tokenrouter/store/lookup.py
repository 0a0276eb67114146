"""Finding a model: by path or by store name, pulled on request; and what the store holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFoundError
from .layout import COMPLETE_MARKER, gguf_path, home_dir, model_dir
from .model_files import derived_dir, ensure_model
from .registry import MODELS, expand


def pull(name: str, home: str | Path | None = None) -> list[Path]:
    """Fetch a model or a group of models, with their config and tokenizer (`tokenrouter pull`); a
    no-op when present."""
    return [ensure_model(n, home) for n in expand(name)]


def is_pulled(name: str, home: str | Path | None = None) -> bool:
    return (model_dir(name, home) / COMPLETE_MARKER).is_file()


def pull_command(name: str) -> str:
    return f"tokenrouter pull {name}"


def locate_model(where: str | Path, *, pull: bool = False, home: str | Path | None = None) -> Path:
    """Where a model is: an existing path (a Hugging Face directory or a .gguf file) as it is,
    else the directory of the store model of that name (its config and tokenizer, beside the GGUF
    `gguf_for` finds), fetched now if `pull`. The one
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
    size_bytes: int  # the GGUF file plus its directory (config, tokenizer, a dense copy if written), 0 when absent


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
    """The GGUF whose files a store directory holds: a store model's verified GGUF
    (`<home>/gguf/<name>.gguf`, beside `<home>/models/<name>/`), or the file a derived directory
    (`<home>/derived/...`) was written for; None for any other directory."""
    directory = Path(directory).resolve()
    marker = directory / COMPLETE_MARKER
    if directory.parent.name not in ("models", "derived") or not marker.is_file():
        return None
    written_for = marker.read_text().strip()
    if directory.parent.name == "derived":
        gguf = Path(written_for)  # and unchanged since: the directory's name holds its size and mtime
        return gguf if gguf.is_absolute() and gguf.is_file() and derived_dir(gguf).name == directory.name else None
    gguf = directory.parent.parent / "gguf" / f"{directory.name}.gguf"
    source = MODELS.get(directory.name)
    return gguf if source is not None and written_for == source.sha256 and gguf.is_file() else None
