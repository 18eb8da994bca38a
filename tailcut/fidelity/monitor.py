"""Watch a run's training window on this host and give its verdict.

The local runtime starts a Monitor when the job starts training and stops it when
the job is done: it reads the host's CPU at both ends, the processes' CPU about once
a second and every shaped link end's queue every SAMPLE_S (fidelity.links), in one
thread of the runner, which otherwise waits for the roles' events.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from tailcut.fidelity import hostcpu, links, processes, verdict


class Monitor:
    def __init__(self, ends: Mapping[str, int], delay: Optional[Mapping[str, Any]] = None
                 ) -> None:
        """`ends`: "namespace/ifname" -> configured rate in bit/s."""
        self.tally = processes.Tally(roots={os.getpid()})
        self.sampler = links.Sampler(dict(ends), every_second=self._read_processes)
        self.delay = delay
        self.host_before: Optional[hostcpu.Reading] = None
        self.result: Optional[dict[str, Any]] = None

    def _read_processes(self) -> None:
        self.tally.add(processes.read())

    def start(self, job_pids: Optional[set[int]] = None) -> None:
        """The window starts now. `job_pids`: the job's processes (its roles, its
        background load), whose trees and this process are the job's; by default this
        process's whole tree (a test's or a bench's other children would count too)."""
        if job_pids is not None:
            self.tally.roots, self.tally.own = set(job_pids), frozenset({os.getpid()})
        self.host_before = hostcpu.read()
        self._read_processes()
        self.sampler.start()

    def stop(self) -> dict[str, Any]:
        """The verdict over the window since `start` (empty evidence if never started);
        a second call returns the first one's."""
        if self.result is None:
            if self.host_before is None:
                self.result = verdict.judge(delay=self.delay)
            else:
                sampled = self.sampler.stop()
                self._read_processes()
                host = hostcpu.window(self.host_before, hostcpu.read())
                procs = self.tally.summary(host["wall_s"], host["cores"])
                self.result = verdict.judge(host=host, processes=procs, links=sampled,
                                            delay=self.delay)
        return self.result
