"""`tailcut doctor`: run every kernel feature probe and print what each result means for a job."""

import os
import sys
import textwrap
import time
from collections.abc import Sequence

from tailcut import features
from tailcut.features import Feature
from tailcut.transports import rxfast

# Column widths of the table; the last two wrap.
_DETAIL_WIDTH = 48
_MEANING_WIDTH = 56


def _collect() -> tuple[list[Feature], list[str]]:
    """Every probe's result, and a line for each probe that broke (rather than
    answering); a broken probe still gets a row, marked unavailable."""
    found: list[Feature] = []
    broken: list[str] = []
    for probe in features.ALL:
        try:
            found.append(probe())
        except Exception as err:  # noqa: BLE001 -- one broken probe must not hide the rest
            name = probe.__name__
            broken.append(f"{name}: {type(err).__name__}: {err}")
            found.append(Feature(name, False, f"probe failed: {type(err).__name__}: {err}",
                                 "unknown: the probe itself failed (a tailcut bug or an "
                                 "unusual machine); please report it"))
    found.append(_datagram_paths())
    return found, broken


def _datagram_paths() -> Feature:
    """Whether bounded-loss senders and receivers run txfast.c and rxfast.c (not a
    kernel feature, but what a bounded-loss job's CPU depends on most after the
    kernel's)."""
    lib = rxfast.library()
    return Feature("compiled_datagram_paths", lib is not None, rxfast.status(),
                   "bounded-loss and udp senders build their bursts, and receivers check "
                   "and place datagrams, in C"
                   if lib is not None else
                   "bounded-loss and udp senders and receivers use numpy for every burst "
                   "and batch: 1.6-1.8x the receive threads' CPU in the quickstart, 1.8x "
                   "the send threads' CPU per pass (install gcc; docs/bounded-loss.md)")


def run() -> list[Feature]:
    """Probe every feature (cached per process)."""
    return _collect()[0]


def render(found: Sequence[Feature]) -> str:
    """A table: feature, yes/no, what the probe saw, what it means for a job."""
    name_width = max([len("feature"), *(len(f.name) for f in found)])
    header = ("feature".ljust(name_width), "ok ", "detail".ljust(_DETAIL_WIDTH),
              "what it means for a job")
    lines = ["  ".join(header).rstrip(),
             "  ".join("-" * len(h) for h in header)]
    for f in found:
        detail = textwrap.wrap(f.detail, _DETAIL_WIDTH) or [""]
        meaning = textwrap.wrap(f.meaning, _MEANING_WIDTH) or [""]
        for i in range(max(len(detail), len(meaning))):
            cells = (f.name if i == 0 else "", ("yes" if f.available else "NO") if i == 0
                     else "", detail[i] if i < len(detail) else "",
                     meaning[i] if i < len(meaning) else "")
            lines.append("  ".join((cells[0].ljust(name_width), cells[1].ljust(3),
                                    cells[2].ljust(_DETAIL_WIDTH), cells[3])).rstrip())
    return "\n".join(lines)


def main() -> int:
    """Print the table. Exit 0 even when features are missing (that is an answer);
    1 if not root (most probes could not run) or a probe itself failed."""
    started = time.monotonic()
    found, broken = _collect()
    print(render(found))
    print(f"\nprobed {len(found)} features in {time.monotonic() - started:.2f} s")
    for line in broken:
        print(f"tailcut doctor: probe failed: {line}", file=sys.stderr)
    if os.geteuid() != 0:
        print("tailcut doctor: run as root; most probes need it", file=sys.stderr)
        return 1
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
