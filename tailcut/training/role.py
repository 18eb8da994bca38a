"""Entry point of a PS, replica, aggregator or worker process: ``python -m tailcut.training.role CONFIG.json``.

The local runtime starts its roles as forks of itself instead, calling `main` in the
child (tailcut.runtime.rolefork): the same role, without the imports.

Prints JSON lines on stdout, one per event, flushed at once so the runtime can
follow progress: the PS's start/epoch/done events, a worker's worker_done, and on
failure ``{"event": "error", "role": ..., "index": ..., "message": ...}``. Each
role's closing event (done, worker_done, aggregator_done) carries ``"tcp"``: its
pod's TCP counters since the role started (tailcut.training.tcpstats), also written
to tcp-<pod>.json in its results directory.

Exit status: 0 the role finished (for the PS: the job stopped, converged or not,
see "done"), 1 the run failed (error event), 2 the command line or config file is
wrong, 3 the run failed because another role went away first, so the runtime can
name the role that failed first rather than its victims (see exits.py).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "numpy" in sys.modules:
    # e.g. a package __init__ imported it: too late to limit threads
    print(
        "tailcut role: numpy was imported before the thread limit; set OMP_NUM_THREADS=1",
        file=sys.stderr,
    )

# Five or more roles share two cores: one BLAS thread each, or they oversubscribe
# the CPU and every iteration waits for descheduled threads. Set before numpy loads.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import faulthandler  # noqa: E402 - after the thread settings above
import gc  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402
from typing import Any, Callable  # noqa: E402

from tailcut import errors  # noqa: E402
from tailcut.fidelity import hostcpu  # noqa: E402
from tailcut.spec import sync_modes  # noqa: E402
from tailcut.training import (aggregator, config, cpustats, exits, ps, tcpstats,  # noqa: E402
                              worker)
from tailcut.transports import rxfast  # noqa: E402
from tailcut.transports.base import PeerClosed  # noqa: E402

USAGE = "usage: python -m tailcut.training.role CONFIG.json"
DONE_EVENTS = ("done", "worker_done", "aggregator_done")


def emit(event: dict[str, Any]) -> None:
    """Print one event as a JSON line and flush it."""
    print(json.dumps(event), flush=True)


def main(argv: list[str] | None = None,
         emit: Callable[[dict[str, Any]], None] = emit) -> int:
    """Run the role of the config file in `argv`; each event goes to `emit`."""
    args = sys.argv[1:] if argv is None else argv
    # `kill -USR1 <pid>` prints every thread's stack to stderr (the role's log): where
    # a role that hangs is stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return exits.USAGE
    try:
        cfg = config.RoleConfig.from_json(args[0])
    except (config.ConfigError, TypeError) as err:
        exits.say_failed(emit, "?", -1, f"{args[0]}: {err}")
        return exits.USAGE
    emit = _with_host_cpu(_with_cpu_time(cfg, _with_tcp_counters(cfg, emit)))
    try:
        all_reduce = not sync_modes.get(cfg.sync_mode).has_ps
        if all_reduce and cfg.transport["type"] == "tcp":
            # no PS: DDP over Gloo; rank 0 reports
            from tailcut.training import allreduce  # here: it imports torch
            emit(allreduce.run(cfg, emit))
        elif all_reduce:   # no PS: the transpose all-reduce
            from tailcut.training import transpose
            emit(transpose.run(cfg, emit))
        elif cfg.role in ("ps", "replica"):
            ps.run(cfg, emit)
        elif cfg.role == "aggregator":
            emit(aggregator.run(cfg))
        else:
            emit(worker.run(cfg))
    except errors.TailcutError as err:
        exits.say_failed(emit, cfg.role, cfg.index, str(err))
        return exits.PEER_GONE if _peer_went_away(err) else exits.FAILED
    except Exception as err:  # anything else is our bug: say so, keep the traceback
        traceback.print_exc()
        exits.say_failed(emit, cfg.role, cfg.index,
              f"internal error (a tailcut bug, please report it): {err!r}")
        return exits.FAILED
    return exits.OK


def _with_tcp_counters(cfg: config.RoleConfig, emit: Callable[[dict[str, Any]], None]
                       ) -> Callable[[dict[str, Any]], None]:
    """`emit`, adding to the role's closing event its pod's TCP counters since now.
    Here, around every role, because this process runs in the pod's network
    namespace under both executors. Counters the kernel will not show cost the run
    nothing but a warning: they only explain it."""
    pod = f"{cfg.role}-{cfg.index}"
    try:
        before = tcpstats.read()
    except tcpstats.CountersError as err:
        print(f"tailcut {pod}: TCP counters not recorded: {err}", file=sys.stderr, flush=True)
        return emit

    def emit_with_counters(event: dict[str, Any]) -> None:
        if event.get("event") in DONE_EVENTS:
            try:
                counts = tcpstats.delta(before, tcpstats.read())
                tcpstats.write(cfg.results_dir, pod, counts,
                               cfg.transport.get("congestion_control")
                               or tcpstats.default_congestion_control())
            except (tcpstats.CountersError, OSError) as err:
                print(f"tailcut {pod}: TCP counters not recorded: {err}", file=sys.stderr,
                      flush=True)
            else:
                event = {**event, "tcp": counts}
        emit(event)
    return emit_with_counters


def _with_cpu_time(cfg: config.RoleConfig, emit: Callable[[dict[str, Any]], None]
                   ) -> Callable[[dict[str, Any]], None]:
    """`emit`, adding to the role's closing event the CPU its threads used while it
    trained (tailcut.training.cpustats), also written to cpu-<pod>.json. The PS's
    "start" event marks the start; a worker marks it itself before its first step."""
    pod = f"{cfg.role}-{cfg.index}"

    def emit_with_cpu(event: dict[str, Any]) -> None:
        if event.get("event") == "start":
            cpustats.mark()
        elif event.get("event") in DONE_EVENTS:
            usage = cpustats.since_mark()
            paths = rxfast.used()
            if paths is not None:   # which code the datagram threads' CPU was spent in
                usage[cpustats.DATAGRAM_PATHS] = paths
            try:
                cpustats.write(cfg.results_dir, pod, usage)
            except OSError as err:
                print(f"tailcut {pod}: CPU time not recorded: {err}", file=sys.stderr,
                      flush=True)
            event = {**event, "cpu": usage}
        emit(event)
    return emit_with_cpu


def _with_host_cpu(emit: Callable[[dict[str, Any]], None]
                   ) -> Callable[[dict[str, Any]], None]:
    """`emit`, adding to the leader's "done" event the host's CPU over the training
    window, from its "start" event on (tailcut.fidelity.hostcpu: host-wide, also inside
    a pod): on Kubernetes the job's fidelity verdict comes from it."""
    started: list[hostcpu.Reading] = []

    def emit_with_host(event: dict[str, Any]) -> None:
        if event.get("event") == "start" and not started:
            started.append(hostcpu.read())
        elif event.get("event") == "done" and started:
            event = {**event, "host": hostcpu.window(started[0], hostcpu.read())}
        emit(event)
    return emit_with_host


def _peer_went_away(err: BaseException | None) -> bool:
    """True when `err` (or what caused it) is another role disappearing."""
    while err is not None:
        if isinstance(err, (worker.PSGone, PeerClosed)):
            return True
        err = err.__cause__
    return False


if __name__ == "__main__":
    status = main()
    # The process ends now: its interpreter's last garbage collection would walk every
    # object numpy and the role hold, a tenth of a second or more that the runner
    # waits for (it tears the network down after the roles exit). Frozen, they are
    # left to the exit; atexit handlers and the flushing of files still run.
    gc.freeze()
    sys.exit(status)
