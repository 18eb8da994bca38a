"""Compile failures of a BPF program reach the caller as DatapathError with clang's words."""

from pathlib import Path

import pytest

from tailcut.datapath import bcc
from tailcut.errors import DatapathError

pytestmark = pytest.mark.bpf


def test_missing_define_fails_with_the_compilers_message() -> None:
    with pytest.raises(DatapathError) as caught:
        bcc.load("partial", {"tailcut_partial": "xdp"})
    assert "cannot compile partial.bpf.c" in str(caught.value)
    assert "TAILCUT_BL_STRIDE" in str(caught.value)  # the #error line, from clang


def test_source_is_found_from_the_loader_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    program = bcc.load("dropper", {"tailcut_drop": "sched_cls"})
    try:
        assert program.fds["tailcut_drop"] > 0
    finally:
        program.close()


def test_a_syntax_error_names_the_line(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.bpf.c").write_text("int f(struct __sk_buff *skb) { return x; }\n")
    monkeypatch.setattr(bcc, "EBPF_DIR", tmp_path)
    with pytest.raises(DatapathError, match="use of undeclared identifier 'x'"):
        bcc.load("broken", {"f": "sched_cls"})


def test_a_missing_source_is_a_datapath_error() -> None:
    with pytest.raises(DatapathError, match="nothing.bpf.c is missing"):
        bcc.load("nothing", {"f": "sched_cls"})


def test_a_verifier_rejection_carries_the_verifier_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "unchecked.bpf.c").write_text(
        "#include <uapi/linux/bpf.h>\n"
        "int f(struct __sk_buff *skb) { return *(int *)(long)skb->data; }\n")
    monkeypatch.setattr(bcc, "EBPF_DIR", tmp_path)
    with pytest.raises(DatapathError, match="(?s)cannot load unchecked.bpf.c.*"
                                            "invalid access to packet"):
        bcc.load("unchecked", {"f": "sched_cls"})
