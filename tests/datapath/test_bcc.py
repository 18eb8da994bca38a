"""Compile failures of a BPF program reach the caller as DatapathError with clang's words."""

from pathlib import Path

import pytest

from tailcut.datapath import bcc
from tailcut.errors import DatapathError, NoKernelHeaders

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


def test_missing_kernel_headers_are_named_with_the_fix_before_bcc_is_asked(tmp_path: Path):
    """A kind node without the host's /usr/src: /lib/modules/<release>/build (the
    host's, mounted) points nowhere."""
    release = tmp_path / "modules" / "6.18.0"
    release.mkdir(parents=True)
    (release / "build").symlink_to("/usr/src/linux-headers-nowhere")
    (release / "modules.dep").write_text("kernel/net/sched/sch_htb.ko:\n")
    said = bcc.headers_problem("6.18.0", tmp_path / "modules", tmp_path / "kheaders.tar.xz")
    assert said is not None
    assert said.startswith(f"the headers of the running kernel 6.18.0 are missing: "
                           f"{release / 'build'} points to /usr/src/linux-headers-nowhere, "
                           "which is not here. Install them")
    for fix in ("linux-headers-$(uname -r)", "/usr/src", "extraMounts", "scripts/kind-up.sh"):
        assert fix in said
    # The kernel's own headers (CONFIG_IKHEADERS) serve BCC as well.
    (release / "modules.dep").write_text("kernel/kernel/kheaders.ko:\n")
    assert bcc.headers_problem("6.18.0", tmp_path / "modules",
                               tmp_path / "kheaders.tar.xz") is None
    (release / "build").unlink()
    (release / "build").mkdir()
    assert bcc.headers_problem("6.18.0", tmp_path / "modules",
                               tmp_path / "kheaders.tar.xz") is None
    assert bcc.headers_problem() is None, "this machine compiles the other tests' programs"


def test_loading_without_kernel_headers_raises_no_kernel_headers(monkeypatch) -> None:
    monkeypatch.setattr(bcc, "headers_problem", lambda: "the headers ... are missing")
    with pytest.raises(NoKernelHeaders, match=r"^cannot compile dropper.bpf.c: the headers"):
        bcc.load("dropper", {"tailcut_drop": "sched_cls"})
