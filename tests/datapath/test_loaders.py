"""Every BPF program under ebpf/ has its loader in tailcut/datapath/, and vice versa."""

from pathlib import Path

import tailcut.datapath
from tailcut.datapath import bcc

DATAPATH = Path(tailcut.datapath.__file__).parent


def program_stems() -> set[str]:
    return {p.name.removesuffix(".bpf.c") for p in bcc.EBPF_DIR.glob("*.bpf.c")}


def loader_stems() -> set[str]:
    return {p.stem for p in DATAPATH.glob("*.py")
            if p.stem != "__init__" and p.stem not in tailcut.datapath.HELPERS}


def test_every_program_has_a_loader_and_every_loader_a_program() -> None:
    assert program_stems(), f"no programs found under {bcc.EBPF_DIR}"
    assert program_stems() == loader_stems()


def test_every_program_has_a_header_of_the_same_stem() -> None:
    for stem in program_stems():
        assert (bcc.EBPF_DIR / f"{stem}.h").is_file(), f"ebpf/{stem}.h is missing"


def test_helpers_named_in_the_package_exist() -> None:
    for name in tailcut.datapath.HELPERS:
        assert (DATAPATH / f"{name}.py").is_file()
