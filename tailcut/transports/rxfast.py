"""rxfast.c and txfast.c, built and loaded as one library: the receive thread's
per-batch steps and the send thread's bursts in compiled code.

A bounded-loss receive loop spent most of its CPU in the fixed cost of ~30 numpy calls
per batch (docs/bounded-loss.md); rxfast.c does the same two steps (splitting a
UDP_GRO read into datagram rows, and a batch of one live message's packets put in
place) in one call each; txfast.c builds and sends a burst's messages in one call
(batch.CompiledBatch). The numpy code stays as the fallback and as the reference the
tests hold the C to.

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

from tailcut import ebpfheaders

SOURCES = (Path(__file__).with_name("rxfast.c"), Path(__file__).with_name("txfast.c"))
HEADER = ebpfheaders.EBPF_DIR / "partial.h"
ABI = 2  # RXFAST_ABI in rxfast.c
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")


class Message(ctypes.Structure):
    """struct rx_message of rxfast.c: one live message's checks and arrays."""

    _fields_ = [("template_words", ctypes.c_uint32 * 8), ("shared_bits", ctypes.c_uint32 * 8),
                ("source", ctypes.c_int64), ("total", ctypes.c_int64),
                ("stride", ctypes.c_int64), ("values", ctypes.c_void_p),
                ("mask", ctypes.c_void_p), ("seen", ctypes.c_void_p)]


class TxPass(ctypes.Structure):
    """struct tx_pass of txfast.c: one send pass's arrays (batch.CompiledBatch)."""

    _fields_ = [("fd", ctypes.c_int64), ("to", ctypes.c_void_p), ("headers", ctypes.c_void_p),
                ("header_bytes", ctypes.c_int64), ("values", ctypes.c_void_p),
                ("value_bytes", ctypes.c_int64), ("values_count", ctypes.c_int64),
                ("starts", ctypes.c_void_p), ("ends", ctypes.c_void_p),
                ("slots", ctypes.c_int64), ("order", ctypes.c_void_p),
                ("datagrams", ctypes.c_int64), ("tos", ctypes.c_void_p),
                ("gso_size", ctypes.c_int64), ("max_segments", ctypes.c_int64),
                ("sent_any", ctypes.c_int64), ("interrupt", ctypes.c_int64),
                ("next", ctypes.c_int64), ("last", ctypes.c_int64), ("due_ns", ctypes.c_int64)]


def digest() -> str:
    """What names a build: the sources and the flags."""
    h = hashlib.sha256()
    for part in (*(s.read_bytes() for s in SOURCES), HEADER.read_bytes(),
                 " ".join(CFLAGS).encode()):
        h.update(part)
    return h.hexdigest()[:16]


def library_name() -> str:
    return f"rxfast-{digest()}.so"


def cache_dir() -> Path:
    env = os.environ.get("TAILCUT_NATIVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tailcut" / "native"


def build(out: Path) -> None:
    """Compile the sources into ``out`` (atomically: a concurrent build is harmless).
    Raises OSError or CalledProcessError with the compiler's message."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc) on PATH: apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *CFLAGS, f"-I{HEADER.parent}", "-o", tmp, *map(str, SOURCES)],
                       check=True, capture_output=True, text=True, timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_why_not = ""


@cache
def library() -> ctypes.CDLL | None:  # (cached: asked once per process)
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
        sizes = (lib.rxfast_message_bytes(), lib.txfast_pass_bytes()) if abi == ABI else None
    except subprocess.CalledProcessError as err:
        _why_not = f"compiling {' and '.join(s.name for s in SOURCES)} failed: " \
            f"{err.stderr.strip()[-300:]}"
        return None
    except (OSError, RuntimeError, AttributeError, subprocess.TimeoutExpired) as err:
        # (RuntimeError: no home directory for the cache; AttributeError: not ours)
        _why_not = f"cannot build or load the library: {err}"
        return None
    ours = (ctypes.sizeof(Message), ctypes.sizeof(TxPass))
    if abi != ABI or sizes != ours:
        _why_not = (f"{path} speaks ABI {abi} with structs of {sizes} bytes, this code "
                    f"ABI {ABI} with {ours}")
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
    lib.txfast_send.restype = ctypes.c_long
    lib.txfast_send.argtypes = [ctypes.POINTER(TxPass), ctypes.c_long, ctypes.c_long]
    lib.txfast_pace.restype = ctypes.c_long
    lib.txfast_pace.argtypes = [ctypes.POINTER(TxPass), ctypes.c_void_p, ctypes.c_long,
                                ctypes.c_long, ctypes.c_double, ctypes.c_long, ctypes.c_int64,
                                ctypes.c_int64]
    return lib


def main() -> None:
    """scripts/setup.sh: build the library now, not in a job's first run."""
    print(f"datagram send and receive paths: {status()}")


def used() -> str | None:
    """``status()`` if this process has sent or received datagrams (asked for the
    library), else None: what a role records next to its CPU time."""
    return status() if library.cache_info().currsize else None


def status() -> str:
    """One line for a run's output: whether the compiled paths are in use."""
    return "compiled" if library() is not None else f"numpy ({_why_not})"


if __name__ == "__main__":
    main()
