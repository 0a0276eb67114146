"""The GPU kit is complete (docs/gpu.md, "The wheels"), checked offline: every requirement of tokenrouter's core
install and of its `[gpu]` extra, and of every wheel the kit carries (their Requires-Dist as
scripts/gpu_wheels_requires.txt records them; `gpu_kit verify-wheels` checks that record against the built
wheels), with markers evaluated for the GPU machine (CPython 3.12, Linux x86_64), is met by the machine's own
packages (scripts/gpu_machine.txt) or by the kit's pins (scripts/gpu_wheels.txt), at a version its specifier
allows. No wheel and no network needed.

Before xgrammar was pinned this failed with "tokenrouter requires xgrammar>=0.2.9: neither the GPU machine
(gpu_machine.txt) nor the kit (gpu_wheels.txt) has xgrammar".
"""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from scripts.gpu_kit.completeness import check_complete
from scripts.gpu_kit.lists import format_requires, project_requirements, read_machine, read_pins, read_requires
from scripts.gpu_kit.wheel_files import norm, requires_lines, stand_in_wheel, wheel_metadata


@pytest.fixture(scope="module")
def real():
    _, deps, extras = project_requirements()
    return {
        "deps": deps,
        "gpu": extras["gpu"],
        "pins": read_pins(),
        "machine": read_machine(),
        "recorded": read_requires(),
    }


def test_every_requirement_of_the_core_install_and_gpu_extra_is_met(real):
    problems, met = check_complete(**real)
    assert problems == []
    # the core install's and [gpu]'s own requirements are all among what was checked
    for text in real["deps"] + real["gpu"]:
        assert norm(Requirement(text).name) in met, text
    assert met["xgrammar"].startswith("kit ") and met["apache-tvm-ffi"].startswith("kit ")
    assert met["flashinfer-python"] == "kit 0.7.4+trim"
    # carried wheels' own requirements were followed: xgrammar's triton (a Linux x86_64 marker) from the machine
    assert met["triton"].startswith("machine ")


def test_every_pin_has_its_requirements_recorded_and_nothing_else_is(real):
    assert sorted(real["recorded"]) == sorted(real["pins"])


def _without(d: dict, *names: str) -> dict:
    return {k: v for k, v in d.items() if k not in names}


def test_a_missing_core_dependency_is_named(real):
    """As on the tree before xgrammar was carried: the core install's xgrammar is met by neither list."""
    problems, _ = check_complete(
        real["deps"],
        real["gpu"],
        _without(real["pins"], "xgrammar"),
        real["machine"],
        _without(real["recorded"], "xgrammar"),
    )
    assert problems == [
        "tokenrouter requires xgrammar>=0.2.9: neither the GPU machine (gpu_machine.txt) nor the kit "
        "(gpu_wheels.txt) has xgrammar"
    ]


def test_a_carried_wheels_own_missing_dependency_is_named(real):
    pins = _without(real["pins"], "apache-tvm-ffi")
    problems, _ = check_complete(
        real["deps"], real["gpu"], pins, real["machine"], _without(real["recorded"], "apache-tvm-ffi")
    )
    assert any(p.startswith("xgrammar requires apache-tvm-ffi>=0.1.11: neither") for p in problems), problems
    assert any(p.startswith("flashinfer-python requires apache-tvm-ffi<0.2,>=0.1.11: neither") for p in problems)


def test_a_version_the_specifier_refuses_is_named(real):
    """pydantic 2.14 needs typing-extensions>=4.16.0: the machine's copy would not do if it were older."""
    machine = {**real["machine"], "typing-extensions": "4.12.2"}
    pins = _without(real["pins"], "typing-extensions")
    problems, _ = check_complete(
        real["deps"], real["gpu"], pins, machine, _without(real["recorded"], "typing-extensions")
    )
    assert "pydantic requires typing-extensions>=4.16.0: the machine has typing-extensions 4.12.2" in problems


def test_markers_are_evaluated_for_linux_x86_64_python_312_and_extras_are_followed():
    pins = {"a": ("1.0", "0" * 64), "b": ("2.0", "0" * 64)}
    recorded = {
        "a": (
            "1.0",
            [
                "Requires-Python: >=3.10",
                'Requires-Dist: winonly; sys_platform == "win32"',
                'Requires-Dist: old; python_version < "3.10"',
                'Requires-Dist: linux-x86; platform_system == "Linux" and platform_machine == "x86_64"',
                'Requires-Dist: b>=2; extra == "more"',
                'Requires-Dist: never; extra == "other"',
            ],
        ),
        "b": ("2.0", ["Requires-Python: >=3.13"]),
    }
    problems, met = check_complete(["a"], [], pins, {"linux-x86": "1"}, recorded)
    assert problems == [] and sorted(met) == ["a", "linux-x86"]  # no extra asked for: b is not needed
    problems, met = check_complete(["a[more]"], [], pins, {"linux-x86": "1"}, recorded)
    assert problems == ["b 2.0 requires Python >=3.13: the machine has 3.12"] and "never" not in met


def test_an_unrecorded_pin_and_an_unknown_machine_version_are_problems():
    problems, _ = check_complete(["c>=1", "d"], [], {"c": ("1.0", "0" * 64)}, {"d": ""}, {})
    assert problems == ["c==1.0 is pinned, but gpu_wheels_requires.txt does not record its Requires-Dist"]
    problems, _ = check_complete(["d>=1"], [], {}, {"d": ""}, {})
    assert problems == ["tokenrouter requires d>=1: the machine's d version is not recorded"]


def test_the_record_is_checked_against_a_wheels_metadata(tmp_path):
    """verify-wheels' comparison: the record holds a wheel's Requires-* lines verbatim."""
    wheel = stand_in_wheel(tmp_path, "demo", "1.0", ["numpy>=1", 'triton; platform_system == "Linux"'])
    text = format_requires([wheel])
    record = tmp_path / "requires.txt"
    record.write_text(text)
    assert read_requires(record) == {
        "demo": ("1.0", ["Requires-Dist: numpy>=1", 'Requires-Dist: triton; platform_system == "Linux"'])
    }
    assert requires_lines(wheel_metadata(wheel)) == read_requires(record)["demo"][1]
