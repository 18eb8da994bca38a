"""rxfast.c, built and loaded: the receive thread's per-batch steps in compiled code.

A bounded-loss receive loop spent most of its CPU in the fixed cost of ~30 numpy calls
per batch (docs/bounded-loss.md); rxfast.c does the same two steps (splitting a
UDP_GRO read into datagram rows, and a batch of one live message's packets put in
place) in one call each. The numpy code stays as the fallback and as the reference
the tests hold the C to.

The library is compiled with the system's C compiler the first time it is needed
(scripts/setup.sh does it once) and kept under ~/.cache/tailcut/native (or
$TAILCUT_NATIVE_CACHE, a directory only its user can write: what is there is loaded),
named by a hash of its sources, so an edited source never runs
stale. An image carries it prebuilt from its own sources and names it in
$TAILCUT_RXFAST_LIB (workers/Dockerfile). Without a compiler, or with TAILCUT_NATIVE=0,
the numpy code runs, and ``status()`` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from tailcut.datapath import bcc

SOURCE = Path(__file__).with_name("rxfast.c")
HEADER = bcc.EBPF_DIR / "partial.h"
ABI = 1  # RXFAST_ABI in rxfast.c
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")


class Message(ctypes.Structure):
    """struct rx_message of rxfast.c: one live message's checks and arrays."""

    _fields_ = [("template_words", ctypes.c_uint32 * 8), ("shared_bits", ctypes.c_uint32 * 8),
                ("source", ctypes.c_int64), ("total", ctypes.c_int64),
                ("stride", ctypes.c_int64), ("values", ctypes.c_void_p),
                ("mask", ctypes.c_void_p), ("seen", ctypes.c_void_p)]


def digest() -> str:
    """What names a build: the sources and the flags."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), HEADER.read_bytes(), " ".join(CFLAGS).encode()):
        h.update(part)
    return h.hexdigest()[:16]


def library_name() -> str:
    return f"rxfast-{digest()}.so"


def cache_dir() -> Path:
    env = os.environ.get("TAILCUT_NATIVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tailcut" / "native"


def build(out: Path) -> None:
    """Compile rxfast.c into ``out`` (atomically: a concurrent build is harmless).
    Raises OSError or CalledProcessError with the compiler's message."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc) on PATH: apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *CFLAGS, f"-I{HEADER.parent}", "-o", tmp, str(SOURCE)],
                       check=True, capture_output=True, text=True, timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_why_not = ""


@cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (then ``status()`` says why)."""
    global _why_not
    if os.environ.get("TAILCUT_NATIVE", "1") == "0":
        _why_not = "off (TAILCUT_NATIVE=0)"
        return None
    prebuilt = os.environ.get("TAILCUT_RXFAST_LIB")
    try:
        path = Path(prebuilt) if prebuilt else cache_dir() / library_name()
        if not prebuilt and not path.exists():
            build(path)
        lib = ctypes.CDLL(str(path))
        abi = lib.rxfast_abi()
        message_bytes = lib.rxfast_message_bytes() if abi == ABI else None
    except subprocess.CalledProcessError as err:
        _why_not = f"compiling {SOURCE.name} failed: {err.stderr.strip()[-300:]}"
        return None
    except (OSError, RuntimeError, AttributeError, subprocess.TimeoutExpired) as err:
        # (RuntimeError: no home directory for the cache; AttributeError: not ours)
        _why_not = f"cannot build or load the library: {err}"
        return None
    if abi != ABI or message_bytes != ctypes.sizeof(Message):
        _why_not = (f"{path} speaks ABI {abi} with {message_bytes}-byte messages, this "
                    f"code ABI {ABI} with {ctypes.sizeof(Message)}")
        return None
    lib.rxfast_gro_split.restype = ctypes.c_long
    lib.rxfast_gro_split.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                                     ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p]
    lib.rxfast_accept_run.restype = ctypes.c_long
    lib.rxfast_accept_run.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p]
    lib.rxfast_same_message.restype = ctypes.c_long
    lib.rxfast_same_message.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                        ctypes.c_void_p]
    return lib


def main() -> None:
    """scripts/setup.sh: build the library now, not in a job's first run."""
    print(f"receive path: {status()}")


def status() -> str:
    """One line for a run's output: whether the compiled receive path is in use."""
    return "compiled" if library() is not None else f"numpy ({_why_not})"


if __name__ == "__main__":
    main()
