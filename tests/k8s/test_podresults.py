"""A role's results carried in its pod log: the round trip, and every kind of bad block
refused with the pod's name and nothing written outside the target directory."""

import base64
import hashlib
import io
import tarfile

import pytest

from tailcut.k8s import podresults


def block_of(archive: bytes, replica: str = "ps-0") -> list[str]:
    text = base64.b64encode(archive).decode()
    return [f"{podresults.BEGIN} {replica} {hashlib.sha256(archive).hexdigest()} "
            f"{len(archive)}", *[text[i:i + 76] for i in range(0, len(text), 76)],
            f"{podresults.END} {replica}"]


def tar_gz(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member in members:
            if member.isfile():
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            else:
                tar.addfile(member)
    return out.getvalue()


def test_a_results_directory_comes_back_whole_from_the_log(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "epochs.csv").write_text("epoch,accuracy\n1,0.5\n")
    (src / "messages.csv").write_bytes(bytes(range(256)) * 100)
    (src / "subdir").mkdir()   # only the files directly in it are results
    block, left_out = podresults.pack("worker-1", src)
    log = ["{\"event\": \"worker_done\"}", *block.splitlines(), "after"]
    names = podresults.unpack("job-worker-1", log, tmp_path / "out")
    assert sorted(names) == ["epochs.csv", "messages.csv"] and left_out == []
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()


def test_files_beyond_the_size_limit_are_left_out_largest_first(tmp_path, monkeypatch):
    import os
    (tmp_path / "small.csv").write_text("1\n")
    (tmp_path / "big.bin").write_bytes(os.urandom(4096))   # does not compress
    monkeypatch.setattr(podresults, "MAX_ARCHIVE_BYTES", 1024)
    block, left_out = podresults.pack("ps-0", tmp_path)
    assert left_out == ["big.bin"]
    assert podresults.unpack("p", block.splitlines(), tmp_path / "out") == ["small.csv"]


@pytest.mark.parametrize("name", ["../escape", "/etc/evil", "a/b", ".hidden", ".."])
def test_a_member_with_a_path_is_refused(tmp_path, name):
    lines = block_of(tar_gz(tarfile.TarInfo(name)))
    with pytest.raises(podresults.ResultsError, match="job-ps-0: results member"):
        podresults.unpack("job-ps-0", lines, tmp_path / "out")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE,
                                  tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_links_directories_and_devices_are_refused(tmp_path, kind):
    member = tarfile.TarInfo("epochs.csv")
    member.type = kind
    member.linkname = "/etc/passwd"
    with pytest.raises(podresults.ResultsError, match="only plain files"):
        podresults.unpack("p", block_of(tar_gz(member)), tmp_path / "out")


def test_a_changed_line_fails_the_checksum(tmp_path):
    (tmp_path / "a.csv").write_text("1,2,3\n" * 100)
    lines = podresults.pack("ps-0", tmp_path)[0].splitlines()
    body = lines[1]
    lines[1] = ("B" if body[0] != "B" else "C") + body[1:]
    with pytest.raises(podresults.ResultsError, match="checksum"):
        podresults.unpack("job-ps-0", lines, tmp_path / "out")


@pytest.mark.parametrize("lines, match", [
    (["no block here"], "no results block"),
    ([f"{podresults.BEGIN} ps-0 abc 10", "QUJD"], "cut short"),
    ([f"{podresults.BEGIN} ps-0 abc", "QUJD", f"{podresults.END} ps-0"], "malformed"),
    ([f"{podresults.BEGIN} ps-0 abc 3", "not base64!", f"{podresults.END} ps-0"], "base64"),
])
def test_a_missing_or_broken_block_names_the_pod(tmp_path, lines, match):
    with pytest.raises(podresults.ResultsError, match=f"job-ps-0: .*{match}|{match}"):
        podresults.unpack("job-ps-0", lines, tmp_path / "out")


def test_an_archive_that_is_not_a_tarball_is_refused(tmp_path):
    with pytest.raises(podresults.ResultsError, match="unreadable"):
        podresults.unpack("p", block_of(b"definitely not gzip"), tmp_path / "out")
