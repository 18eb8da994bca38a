"""A wheel of tailcut carries every file tailcut reads at run time.

The worker image installs tailcut with `pip install .`, not editable: anything read
from the source tree rather than from the package (once, the wire format's BPF header)
is missing there and the pods die at import. Built from a copy of the tree so the
checkout is left untouched."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "build", "*.egg-info", "__pycache__", ".mypy_cache",
        ".pytest_cache"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(work / "dist"),
                          str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = (work / "dist").glob("tailcut-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_bpf_programs_and_headers_are_in_the_wheel(wheel_names):
    for source in (REPO / "tailcut" / "ebpf").iterdir():
        if source.suffix in (".c", ".h"):
            assert f"tailcut/ebpf/{source.name}" in wheel_names, source.name


def test_the_wire_formats_header_and_the_node_pause_program_are_in_the_wheel(wheel_names):
    assert "tailcut/ebpf/partial.h" in wheel_names   # parsed by tailcut.transports.wire
    assert "tailcut/k8s/node/pause.c" in wheel_names


def test_every_python_package_is_in_the_wheel(wheel_names):
    for init in (REPO / "tailcut").rglob("__init__.py"):
        assert str(init.relative_to(REPO)) in wheel_names, init


def test_the_papers_numbers_are_in_the_wheel(wheel_names):
    # read by tailcut reproduce, the sweep's paper columns and the simulator's headlines
    for name in ("apnet19", "cadentflow", "imc20", "mlfabric"):
        assert f"tailcut/papers/data/{name}.yaml" in wheel_names, name
