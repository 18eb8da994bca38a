"""A wheel of tailcut carries every file tailcut reads at run time.

The worker image installs tailcut with `pip install .`, not editable: anything read
from the source tree rather than from the package (once, the wire format's BPF header)
is missing there and the pods die at import. The BPF programs live in the top-level
ebpf/ and install as tailcut/ebpf/ (package-dir in pyproject.toml), so a wheel is also
installed into a fresh venv outside the tree and read from there. Built from a copy of
the tree so the checkout is left untouched."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tailcut.transports import wire

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "build", "*.egg-info", "__pycache__", ".mypy_cache",
        ".pytest_cache"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(work / "dist"),
                          str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (built,) = (work / "dist").glob("tailcut-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_names(wheel):
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The python of a fresh venv outside the tree with the wheel installed. tailcut's
    dependencies (and BCC) come from the tests' own venv through a .pth line naming its
    site-packages; such a line only adds the path, so that venv's editable tailcut (a
    finder its own .pth files install) stays out."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                          "--no-deps", "--no-index", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def run_installed(python: Path, code: str, cwd: Path) -> dict:
    """Run `code` (it prints one JSON object) in the installed venv, isolated (-I: no
    PYTHONPATH pointing at a checkout) and from a directory outside the tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                         cwd=cwd, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_bpf_programs_and_headers_are_in_the_wheel(wheel_names):
    sources = [p for p in (REPO / "ebpf").iterdir() if p.suffix in (".c", ".h")]
    assert sources, f"no BPF sources under {REPO / 'ebpf'}"
    for source in sources:
        assert f"tailcut/ebpf/{source.name}" in wheel_names, source.name


def test_the_checkout_keeps_the_bpf_files_in_the_top_level_ebpf_only():
    # a second copy under tailcut/ would be the one a checkout's loaders read
    assert (REPO / "ebpf" / "partial.bpf.c").is_file()
    assert not (REPO / "tailcut" / "ebpf").exists()
    assert not list((REPO / "tailcut").rglob("*.bpf.c"))


def test_an_installed_wheel_reads_its_headers_from_the_package_not_a_checkout(
        installed, tmp_path):
    found = run_installed(installed, (
        "import json, tailcut; from tailcut.datapath import bcc; "
        "from tailcut.transports import wire; "
        "print(json.dumps({'package': tailcut.__file__, 'ebpf': str(bcc.EBPF_DIR), "
        "'header': str(wire.HEADER_FILE), 'magic': wire.const('MAGIC')}))"), tmp_path)
    package = Path(found["package"]).parent
    assert package.is_relative_to(installed.parent.parent), found   # the venv's, not ours
    assert Path(found["ebpf"]) == package / "ebpf"
    assert Path(found["header"]) == package / "ebpf" / "partial.h"
    assert found["magic"] == wire.const("MAGIC")


@pytest.mark.bpf
def test_an_installed_wheel_compiles_its_programs_with_their_shared_headers(
        installed, tmp_path):
    # partial: the XDP counter a worker pod compiles; agg includes agg.h and rackport.h
    found = run_installed(installed, (
        "import json; from tailcut.datapath import agg, bcc, partial\n"
        "loaded = {}\n"
        "for program in (partial.compile_program(stride=360),\n"
        "                bcc.load(agg.STEM, {agg.FUNCTION: 'sched_cls'})):\n"
        "    loaded[program.stem] = min(program.fds.values())\n"
        "    program.close()\n"
        "print(json.dumps(loaded))"), tmp_path)
    assert sorted(found) == ["agg", "partial"]
    assert all(fd > 0 for fd in found.values()), found


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
