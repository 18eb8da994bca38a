"""Where a run's wall time goes besides training: tailcut's own overheads, by phase.

A run's wall time is its JCT plus what tailcut spends around it. The phases, in order:

    startup         the interpreter and tailcut's imports, up to local.run(); the
                    roles' modules among them, once: roles are forks of the runner
                    (tailcut.runtime.rolefork), forked ahead of the runner's own
                    imports and the network, to load their datasets meanwhile
    network_build   namespaces, links, addresses, qdiscs (and eBPF droppers) of the job
    datapath        programs the runner loads after the network (CadentFlow classifier,
                    ToR store, ToR aggregation) and the background load's start
    role_start      the roles' processes starting (forks, or new interpreters and
                    their imports; data, any XDP counter compiles) until the PS starts
                    training: the PS's done event minus the launch, minus the JCT
    training        the JCT the PS measured
    role_exit       the roles ending after the PS reported done
    teardown        roles stopped, counters read, datapath detached, namespaces removed
    report          tcp counters, flows, metrics.json, dissection and loss plots (their
                    imports ran in a thread during training; what of them was left)

`bpf_compile` (BCC compiles in the runner; within network_build and datapath) is
shown apart. The run prints one line of these and writes them to metrics.json
(`overhead_s`). The process's exit, after them, is not measured here: `tailcut run`
skips the interpreter's last garbage collection (cli.main), and
bench/run_overhead.py shows what is left as `unaccounted`."""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("startup", "network_build", "datapath", "role_start", "training", "role_exit",
          "teardown", "report")


def process_age_s() -> float:
    """Seconds since this process started (exec included), at the kernel's clock-tick
    resolution (10 ms): the start of a `tailcut run` as its user sees it."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started_ticks = int(fields[19])   # field 22, starttime, counted after "pid (comm)"
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")


class Phases:
    """Seconds per phase of one run, filled in as it goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES and phase != "bpf_compile":
            raise ValueError(f"phase {phase!r}: not one of {', '.join(PHASES)}")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - started)

    def summary(self) -> dict[str, float]:
        """The phases in order (those that ran), `total` (their sum: the run's wall time
        as far as tailcut measures it) and `overhead` (total minus training)."""
        out = {p: round(self.seconds[p], 3) for p in PHASES if p in self.seconds}
        total = sum(self.seconds.get(p, 0.0) for p in PHASES)
        out["total"] = round(total, 3)
        out["overhead"] = round(total - self.seconds.get("training", 0.0), 3)
        if "bpf_compile" in self.seconds:
            out["bpf_compile"] = round(self.seconds["bpf_compile"], 3)
        return out


def describe(summary: dict[str, float]) -> str:
    """One line: 'overheads: startup 0.31 s, network build 0.05 s, ...; 1.20 s of
    tailcut around a JCT of 6.10 s'."""
    parts = [f"{p.replace('_', ' ')} {summary[p]:.2f} s" for p in PHASES
             if p in summary and p != "training"]
    if "bpf_compile" in summary:
        parts.append(f"(BCC compiles {summary['bpf_compile']:.2f} s of those)")
    return (f"overheads: {', '.join(parts)}; {summary['overhead']:.2f} s of tailcut "
            f"around a JCT of {summary.get('training', 0.0):.2f} s")
