"""A role's result files carried in its pod's log, so they outlive the pod on any cluster.

A pod's filesystem goes with the pod, and a finished container cannot be exec'd into;
its log stays readable (`kubectl logs`) until the pod is deleted. At exit, each role
prints its results directory (the files `tailcut run` would find in its results
directory) as one block at the end of its log:

    tailcut-results-begin worker-2 <sha256 of the archive> <archive bytes>
    <the archive, a tar.gz, in base64 lines of 76 characters>
    tailcut-results-end worker-2

`tailcut collect` (tailcut.k8s.collect) reads it back. The reader trusts nothing: a
block with a wrong length or checksum, bad base64, or members that are not plain
files with plain names (no directories, links, `..`, absolute paths) is refused with
an error naming the pod, and nothing is written outside the target directory.
"""

import base64
import binascii
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Iterable, Optional

from tailcut.errors import TailcutError

BEGIN, END = "tailcut-results-begin", "tailcut-results-end"
MAX_ARCHIVE_BYTES = 8 << 20   # compressed; a role's CSVs are far below (kubelet keeps 10 MiB of log)
MAX_FILE_BYTES = 64 << 20     # uncompressed, per member


class ResultsError(TailcutError):
    """A pod's log holds no usable results block; the message names the pod."""


def pack(replica: str, directory: Path) -> tuple[str, list[str]]:
    """The block for the regular files directly in `directory`, and the names left
    out because the archive would exceed MAX_ARCHIVE_BYTES (largest first)."""
    files = sorted((p for p in directory.iterdir() if p.is_file() and not p.is_symlink()),
                   key=lambda p: p.stat().st_size)
    left_out: list[str] = []
    while True:
        archive = _archive(files)
        if len(archive) <= MAX_ARCHIVE_BYTES or not files:
            break
        left_out.append(files.pop().name)
    text = base64.b64encode(archive).decode()
    lines = [text[i:i + 76] for i in range(0, len(text), 76)]
    digest = hashlib.sha256(archive).hexdigest()
    return "\n".join([f"{BEGIN} {replica} {digest} {len(archive)}", *lines,
                      f"{END} {replica}"]), left_out


def _archive(files: list[Path]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in files:
            tar.add(str(path), arcname=path.name, recursive=False)
    return out.getvalue()


def unpack(pod: str, log_lines: Iterable[str], target: Path) -> list[str]:
    """Write the files of the last results block in `log_lines` into `target`; their
    names. Raises ResultsError (naming `pod`) when there is no sound block."""
    header: Optional[list[str]] = None
    body: list[str] = []
    closed = False
    for line in log_lines:
        line = line.rstrip("\r\n")
        if line.startswith(BEGIN + " "):
            header, body, closed = line.split(), [], False
        elif header is not None and line.startswith(END + " "):
            closed = True
        elif header is not None and not closed:
            body.append(line)
    if header is None:
        raise ResultsError(f"{pod}: its log has no results block (did the role finish? "
                           "was it started by an older image?)")
    if not closed or len(header) != 4 or not header[3].isdigit():
        raise ResultsError(f"{pod}: its results block is cut short or malformed")
    try:
        archive = base64.b64decode("".join(body), validate=True)
    except (binascii.Error, ValueError) as err:
        raise ResultsError(f"{pod}: its results block is not base64: {err}") from err
    if len(archive) != int(header[3]) or hashlib.sha256(archive).hexdigest() != header[2]:
        raise ResultsError(f"{pod}: its results block does not match its length and "
                           "checksum (a log line was lost or altered)")
    return _extract(pod, archive, target)


def _extract(pod: str, archive: bytes, target: Path) -> list[str]:
    target.mkdir(parents=True, exist_ok=True)
    names = []
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name
                if (not member.isfile() or "/" in name or "\\" in name
                        or name in ("", ".", "..") or name.startswith(".")):
                    raise ResultsError(f"{pod}: results member {name!r} refused: only "
                                       "plain files with plain names are accepted")
                if member.size > MAX_FILE_BYTES:
                    raise ResultsError(f"{pod}: results member {name!r} is {member.size} "
                                       f"bytes, above {MAX_FILE_BYTES}")
                source = tar.extractfile(member)
                assert source is not None   # a regular file has content
                (target / name).write_bytes(source.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES])
                names.append(name)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ResultsError(f"{pod}: its results archive is unreadable: {err}") from err
    return names
