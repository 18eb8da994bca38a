"""Whose CPU it was: the job's processes, the kernel's threads, or anything else.

A run on a shared host is only as good as the cores it got. /proc/<pid>/stat gives
each process's CPU ticks (user + system, its threads included); readings taken over a
run are split by owner:

- job:    tailcut's runner itself, and every process below the job's roots (its roles,
          Locust and its servers: not whatever else the runner's own parent started);
- kernel: kernel threads (children of kthreadd, pid 2), ksoftirqd among them: the
          packet work the kernel could not do in the senders' own context;
- others: everything else on the host (another job, a build, a test cluster).

A process is known by (pid, start time), so a reused pid is not mistaken for the
one before it. A process that starts and ends between two readings is not seen;
`Tally` reads often enough (the sampler's second) that such a process has to be short.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

KTHREADD = 2
KINDS = ("job", "kernel", "others")


@dataclass(frozen=True)
class Proc:
    ppid: int
    name: str
    ticks: int      # utime + stime


def read() -> dict[tuple[int, int], Proc]:
    """Every process of the host now, by (pid, start time in ticks since boot)."""
    out: dict[tuple[int, int], Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue   # gone since the listing
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        # fields[0] is the state (stat's 3rd field): ppid 4th, utime 14th, stime 15th,
        # starttime 22nd
        out[(int(entry), int(fields[19]))] = Proc(ppid=int(fields[1]), name=name,
                                                   ticks=int(fields[11]) + int(fields[12]))
    return out


def owner(pid: int, procs: dict[int, Proc], roots: set[int],
          own: frozenset[int] = frozenset()) -> str:
    """Which of KINDS process `pid` belongs to, following its parents: the job's if it
    is one of `own` or below one of `roots`."""
    if pid in own:
        return "job"
    seen = 0
    while pid > 1 and seen < 64:
        if pid in roots:
            return "job"
        if pid == KTHREADD:
            return "kernel"
        proc = procs.get(pid)
        if proc is None:
            return "others"
        if proc.ppid == KTHREADD:
            return "kernel"
        pid, seen = proc.ppid, seen + 1
    return "others"


@dataclass
class Tally:
    """CPU seconds per owner between the first reading and the last (`add` each)."""

    roots: set[int]
    own: frozenset[int] = frozenset()   # the job's too, but not what they started
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    # the busiest other processes: name -> seconds
    others: dict[str, float] = field(default_factory=dict)
    _last: dict[tuple[int, int], Proc] = field(default_factory=dict)
    _tick: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))

    def add(self, now: dict[tuple[int, int], Proc]) -> None:
        if self._last:
            by_pid = {pid: p for (pid, _), p in now.items()}
            for key, proc in now.items():
                # one that appeared since the last reading started within the window:
                # all its CPU is the window's
                before = self._last.get(key)
                used = (proc.ticks - (before.ticks if before else 0)) / self._tick
                if used <= 0:
                    continue
                kind = owner(key[0], by_pid, self.roots, self.own)
                self.seconds[kind] += used
                if kind == "others":
                    self.others[proc.name] = self.others.get(proc.name, 0.0) + used
        self._last = now

    def summary(self, wall_s: float, cores: int) -> dict[str, object]:
        """Seconds per owner, and each as a share of the window's cores."""
        span = max(wall_s * cores, 1e-9)
        top = sorted(self.others.items(), key=lambda kv: -kv[1])[:5]
        return {"cpu_s": {k: round(v, 2) for k, v in self.seconds.items()},
                "share": {k: round(v / span, 3) for k, v in self.seconds.items()},
                "busiest_others": {name: round(s, 2) for name, s in top if s >= 0.05}}
