"""A program is compiled once per machine: later loads come from its cached image in
milliseconds, with maps of their own, and behave as the compiled program does."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tailcut.datapath import bcc, bpfcache, bpfsys, dropper, partial
from tailcut.transports import wire
from tests.datapath.frames import udp_frame

pytestmark = pytest.mark.bpf

DROPPER = {dropper.FUNCTION: "sched_cls"}
TC_ACT_UNSPEC, TC_ACT_STOLEN = -1, 4


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TAILCUT_BPF_CACHE", str(tmp_path / "bpf"))
    return tmp_path / "bpf"


def set_loss(program: bpfcache.CachedProgram, slot: int, loss: float) -> None:
    table = program.table(dropper.THRESHOLDS_MAP)
    table[table.Key(slot)] = table.Leaf(dropper.threshold(loss))


def verdict(program: bpfcache.CachedProgram) -> int:
    ret, _ = bpfsys.test_run(program.fds[dropper.FUNCTION], bytes(64))
    return ret if ret < 2**31 else ret - 2**32


def test_the_second_load_compiles_nothing_and_gets_maps_of_its_own(cache: Path) -> None:
    first = bpfcache.load(dropper.STEM, DROPPER)
    second = bpfcache.load(dropper.STEM, DROPPER)
    try:
        assert first.compile_s > 0 and second.compile_s == 0
        assert len(list(cache.glob("dropper-*.json"))) == 1
        # Slot 0 (BPF_PROG_TEST_RUN leaves tc_classid 0): drop all in the first only.
        set_loss(first, 0, 1.0)
        assert verdict(first) == TC_ACT_STOLEN and verdict(second) == TC_ACT_UNSPEC
        counts = first.table(dropper.COUNTS_MAP)
        assert sum(c.dropped for c in counts[counts.Key(0)]) == 1
        other = second.table(dropper.COUNTS_MAP)
        assert sum(c.passed for c in other[other.Key(0)]) == 1
    finally:
        first.close()
        second.close()


def test_a_load_from_the_image_takes_milliseconds_in_a_new_process(cache: Path) -> None:
    bpfcache.load(dropper.STEM, DROPPER).close()   # compiles and writes the image
    code = ("import time, tailcut.datapath.bpfcache as c, sys;"
            "t = time.monotonic(); p = c.load('dropper', {'tailcut_drop': 'sched_cls'});"
            "print(p.compile_s, time.monotonic() - t, 'bcc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert float(out[0]) == 0 and float(out[1]) < 0.1
    assert out[2] == "False", "a load from the image does not import BCC"


def test_other_cflags_or_another_source_make_another_image(cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    counter = {partial.FUNCTION: "xdp"}
    a = bpfcache.image_name(partial.STEM, counter, ["-DTAILCUT_BL_STRIDE=360"])
    assert a != bpfcache.image_name(partial.STEM, counter, ["-DTAILCUT_BL_STRIDE=512"])
    changed = tmp_path / "ebpf"
    changed.mkdir()
    for f in bcc.EBPF_DIR.iterdir():
        (changed / f.name).write_text(f.read_text())
    with (changed / "partial.h").open("a") as h:
        h.write("/* one more line */\n")
    monkeypatch.setattr(bcc, "EBPF_DIR", changed)
    assert bpfcache.image_name(partial.STEM, {partial.FUNCTION: "xdp"},
                               ["-DTAILCUT_BL_STRIDE=360"]) != a


def test_a_damaged_image_is_compiled_again(cache: Path) -> None:
    bpfcache.load(dropper.STEM, DROPPER).close()
    (image,) = cache.glob("dropper-*.json")
    image.write_text("{not json")
    program = bpfcache.load(dropper.STEM, DROPPER)
    try:
        assert program.compile_s > 0
        assert json.loads(image.read_text())["functions"]   # written whole again
    finally:
        program.close()


def test_an_unwritable_cache_only_costs_the_compile(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TAILCUT_BPF_CACHE", str(blocker / "bpf"))   # under a file
    program = bpfcache.load(dropper.STEM, DROPPER)
    try:
        assert program.compile_s > 0 and verdict(program) == TC_ACT_UNSPEC
    finally:
        program.close()


def test_the_counters_events_arrive_through_the_ring_buffer_of_a_cached_load(
        cache: Path) -> None:
    job, port = wire.job_id("bl-cache"), 47100
    partial.load(port=port, job=job, p=1.0, stride=360).close()   # the compile
    program = partial.load(port=port, job=job, p=1.0, stride=360)
    try:
        assert program.compile_s == 0
        got: list[object] = []
        table = program.table(partial.EVENTS_MAP)
        table.open_ring_buffer(lambda _c, data, _s: got.append(table.event(data)))
        values = np.arange(700, dtype=np.float32)
        for pkt in wire.packets(values, job=job, message=9, stride=360):
            bpfsys.test_run(program.fds[partial.FUNCTION], udp_frame(pkt, port))
        program.ring_buffer_poll(0)
        (event,) = got
        assert (event.message, event.counted, event.total, event.port) == (9, 700, 700, port)
    finally:
        program.close()
