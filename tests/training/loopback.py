"""Run a whole job's roles as real processes over 127.0.0.1 (shared by the loopback tests)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailcut.training.config import RoleConfig

ROLE = [sys.executable, "-m", "tailcut.training.role"]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def start_ranks(tmp_path: Path, cfgs: list[RoleConfig]) -> list[subprocess.Popen[str]]:
    """All-reduce ranks started as processes, their output piped."""
    procs = []
    for cfg in cfgs:
        path = tmp_path / f"worker-{cfg.index}.json"
        cfg.to_json(path)
        procs.append(subprocess.Popen([*ROLE, str(path)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def run_ranks(tmp_path: Path, cfgs: list[RoleConfig], timeout_s: float = 240
              ) -> list[dict[str, Any]]:
    """Run all-reduce ranks as processes; fail at once, with its stderr, when one fails.
    Returns rank 0's events."""
    procs = start_ranks(tmp_path, cfgs)
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            assert not failed and time.monotonic() < deadline, \
                [p.stderr.read() for p in failed if p.stderr] if failed else "timed out"
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return [json.loads(line) for line in outs[0][0].splitlines()]


@dataclass
class Job:
    """Configs of every role of one loopback job; ``start`` runs them."""

    tmp_path: Path
    num_workers: int
    shards: int = 1
    replica: bool = False
    groups: list[list[int]] = field(default_factory=list)  # aggregator -> its workers
    options: dict[str, Any] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    @property
    def results(self) -> Path:
        return self.tmp_path / "results"

    def configs(self) -> dict[str, RoleConfig]:
        ports = free_ports(self.shards + 1 + len(self.groups))
        shard_eps = [f"127.0.0.1:{p}" for p in ports[: self.shards]]
        common: dict[str, Any] = dict(
            job="rl-loopback", ps_host="127.0.0.1", ps_port=ports[0],
            num_workers=self.num_workers, results_dir=str(self.results),
            shard_endpoints=shard_eps,
            replica_endpoint=f"127.0.0.1:{ports[self.shards]}" if self.replica else None,
            aggregators=[{"endpoint": f"127.0.0.1:{ports[self.shards + 1 + a]}", "workers": g}
                         for a, g in enumerate(self.groups)],
            **self.options,
        )
        cfgs = {f"worker-{i}": RoleConfig(role="worker", index=i, **common)
                for i in range(self.num_workers)}
        cfgs.update({f"aggregator-{a}": RoleConfig(role="aggregator", index=a, **common)
                     for a in range(len(self.groups))})
        if self.replica:
            cfgs["replica-0"] = RoleConfig(role="replica", index=0, **common)
        cfgs.update({f"ps-{s}": RoleConfig(role="ps", index=s, **common)
                     for s in range(self.shards)})
        return cfgs

    def start(self) -> None:
        self.tmp_path.mkdir(parents=True, exist_ok=True)
        for name, cfg in self.configs().items():
            path = self.tmp_path / f"{name}.json"
            cfg.to_json(path)
            self.procs[name] = subprocess.Popen(
                [*ROLE, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, timeout_s: float = 150) -> dict[str, list[dict[str, Any]]]:
        """Wait for every role; assert each exited 0; return each one's events."""
        outputs: dict[str, tuple[str, str]] = {}
        try:
            for name, p in self.procs.items():
                outputs[name] = p.communicate(timeout=timeout_s)
        finally:
            for p in self.procs.values():
                p.kill()
        codes = {n: p.returncode for n, p in self.procs.items()}
        errs = "\n".join(f"--- {n}\n{e[1][-3000:]}" for n, e in outputs.items() if e[1])
        bad = {n: c for n, c in codes.items() if c != 0}
        assert not bad, f"exit codes {bad}; stderr:\n{errs}"
        return {n: [json.loads(line) for line in out.splitlines()]
                for n, (out, _) in outputs.items()}

    def run(self, timeout_s: float = 150) -> dict[str, list[dict[str, Any]]]:
        self.start()
        return self.finish(timeout_s)
