"""Where each tensor of a GGUF file lies, read from its header without parsing its metadata.

gguf's `GGUFReader` turns every metadata value into numpy arrays, and a chat model's metadata
holds its whole vocabulary and merges (some 300,000 short strings): reading the demo 1.5B's
header that way took 10 s and about 0.5 GB, every time a model loaded. The engine needs only
the tensors' names, types, shapes and offsets, so the metadata is stepped over (a length per
string) and only `general.alignment` is kept. The layout is GGUF v2/v3 as llama.cpp writes it;
`GGUFReader` stays the reference (the tests check both agree).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

# fixed-size metadata value types -> their size in bytes
_FIXED = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}


@dataclass(frozen=True)
class TensorPlace:
    kind: str  # gguf's quantization type name: "Q4_K", "Q6_K", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # innermost first, as gguf lists dims
    offset: int  # in the file
    n_bytes: int


class _Cursor:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def values(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return out

    def take(self, fmt: str):
        out = self.values(fmt)
        return out[0] if len(out) == 1 else out

    def string(self) -> str:
        n = self.take("<Q")
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8")

    def skip(self, kind: int) -> None:
        """Step over one metadata value of type `kind`."""
        if kind in _FIXED:
            self.pos += _FIXED[kind]
        elif kind == GGUFValueType.STRING:
            n = self.take("<Q")  # read before moving: `pos += take()` would add to the old pos
            self.pos += n
        elif kind == GGUFValueType.ARRAY:
            item, count = self.take("<IQ")
            if item in _FIXED:
                self.pos += _FIXED[item] * count
            else:
                for _ in range(count):
                    self.skip(item)
        else:
            raise ValueError(f"unknown GGUF metadata type {kind} at byte {self.pos}")


def tensor_places(path: Path) -> dict[str, TensorPlace]:
    """Every tensor of the GGUF file at `path`: name -> where its bytes are and what they hold."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = c.take("<4xIQQ")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or later)")
        alignment = GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = c.string()
            kind = c.take("<I")
            if key == "general.alignment" and kind == GGUFValueType.UINT32:
                alignment = c.take("<I")
            else:
                c.skip(kind)
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = c.take("<I")
            shape = c.values(f"<{dims}Q")
            kind, offset = c.take("<IQ")
            infos.append((name, GGMLQuantizationType(kind), shape, offset))
        start = -(-c.pos // alignment) * alignment
    places = {}
    for name, kind, shape, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        elements = 1
        for d in shape:
            elements *= d
        places[name] = TensorPlace(kind.name, shape, start + offset, elements // block * block_bytes)
    return places
