"""A GGUF's built kernels, kept in the store so that the next load reads them instead of building.

Building a GGUF model's kernels is most of what a `gguf` load computes: packing each Q4_K tensor
for `_weight_int4pack_mm_for_cpu` and requantizing the other quantized ones to int8 per channel
took 8.5 s of the demo pair's 37 s load. What they hold depends only on the GGUF file, on
torch's packing and on the CPU (the 4-bit layout is the kernel's own), so the first load writes
them to `<home>/kernels/<gguf name>-<key>.safetensors`, the key made of all three, and later
loads with the same three read them (a load that finds no file, or a damaged one, builds as
before). Only for the store's own GGUFs (`<home>/gguf/`), one file per model (a new key
replaces the old file): about the size of the model's 4-bit weights, 1.1 GB for the demo 1.5B.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

import torch

from .. import native

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is stored changes
SAFETENSORS_DTYPES = {
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int32: "I32",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
}
DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def cache_path(gguf_path: Path, home: str | Path | None = None) -> Path | None:
    """Where the kernels built from this GGUF file, by this torch, on this CPU are kept; None for
    a GGUF the store does not hold (a file of the caller's own: built at every load)."""
    from ... import store

    if gguf_path.resolve().parent != (store.home_dir(home) / "gguf").resolve():
        return None
    st = gguf_path.stat()
    key = {
        "format": FORMAT,
        "gguf": [str(gguf_path.resolve()), st.st_size, st.st_mtime_ns],
        "torch": torch.__version__,
        "cpu": native.cpu_identity(),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return store.home_dir(home) / "kernels" / f"{gguf_path.stem}-{digest}.safetensors"


def read(path: Path) -> dict[str, torch.Tensor] | None:
    """The stored tensors by name, each read into memory of its own (aligned as torch allocates:
    the kernels need that, and a view into a mapped file would not give it); None where there is
    no readable file."""
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > path.stat().st_size - 8:
                raise ValueError("not a safetensors file: its header runs past the end")
            header = json.loads(f.read(size))
            header.pop("__metadata__", None)
            base = 8 + size
            out = {}
            for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                start, stop = entry["data_offsets"]
                t = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
                if t.numel() * t.element_size() != stop - start:
                    raise ValueError(f"{name}: {stop - start} bytes for {entry['shape']} {entry['dtype']}")
                f.seek(base + start)
                if f.readinto(t.reshape(-1).view(torch.uint8).numpy()) != stop - start:
                    raise ValueError(f"{name}: the file ends early")
                out[name] = t
            return out
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        RuntimeError,
        struct.error,
    ) as e:  # a damaged file: build again (and rewrite it)
        log.warning("the kernel cache %s is unreadable, building the kernels again: %s", path, e)
        return None


def write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Store the tensors in a safetensors file, one tensor's bytes at a time (no copy of them all
    at once: the load's peak stays what the model holds), whole (a reader never sees half a
    file). Where the store is read-only the next load builds again."""
    from ...files import atomic_path

    for older in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-{'?' * 16}.safetensors"):
        older.unlink(missing_ok=True)  # the same model's kernels from another file, torch or CPU
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for t in tensors.values():
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    except OSError as e:
        log.warning("could not keep the built kernels in %s: %s", path, e)
