"""Wheel files read and written without pip: their names, hashes, METADATA and RECORD; a metadata-only
stand-in; the check that a RECORD matches its files."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from pathlib import Path


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    return norm(parts[0]), parts[1]


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # Python 3.11+: both machines of the kit


def requires_lines(metadata: str) -> list[str]:
    """The Requires-Python and Requires-Dist lines of a METADATA file's header, verbatim."""
    header = metadata.split("\n\n", 1)[0]
    return [ln.strip() for ln in header.splitlines() if ln.startswith(("Requires-Dist:", "Requires-Python:"))]


def wheel_metadata(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(names) != 1:
            raise SystemExit(f"{path.name}: {len(names)} METADATA files")
        return z.read(names[0]).decode()


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def write_wheel(path: Path, entries: list[tuple[zipfile.ZipInfo, bytes]], dist_info: str) -> None:
    """A wheel from (info, data) pairs, in order, with a fresh RECORD; fixed timestamps, so the same input
    gives the same bytes."""
    rows = []
    record = f"{dist_info}/RECORD"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info, data in entries:
            zi = zipfile.ZipInfo(info.filename, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = info.external_attr or (0o644 << 16)
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data, compresslevel=9)
            rows.append(record_line(info.filename, data))
        rows.append([record, "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        zi = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        z.writestr(zi, buf.getvalue().encode(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


def stand_in_wheel(folder: Path, name: str, version: str, requires: list[str] = (), extras: dict = None) -> Path:
    """A wheel of metadata only: what pip's resolver reads."""
    dist = f"{name.replace('-', '_')}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    files = {
        f"{dist}.dist-info/METADATA": "\n".join(lines) + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_kit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = folder / f"{dist}-py3-none-any.whl"
    write_wheel(path, [(zipfile.ZipInfo(k), v.encode()) for k, v in files.items()], f"{dist}.dist-info")
    return path


def verify_record(path: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as z:
        names = [i.filename for i in z.infolist() if not i.is_dir()]
        records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            return [f"{path.name}: {len(records)} RECORD files"]
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read(records[0]).decode())) if r}
        for n in names:
            if n == records[0]:
                continue
            row = rows.get(n)
            if row is None:
                problems.append(f"{path.name}: {n} is not in RECORD")
                continue
            expect = record_line(n, z.read(n))
            if row[1:3] != expect[1:3]:
                problems.append(f"{path.name}: {n}: RECORD says {row[1:3]}, the file is {expect[1:3]}")
        listed_only = set(rows) - set(names)
        if listed_only:
            problems.append(f"{path.name}: RECORD lists absent files: {sorted(listed_only)[:5]}")
    return problems
