"""The local runtime: run a TrainingJob on this host, one network namespace per pod.

Builds the job's network, starts the parameter server and the workers in their pods,
shows progress from the PS's event stream, and always tears the network down again,
whether the run succeeds, fails, times out or is interrupted."""

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from tailcut import features, plan
from tailcut.errors import DatapathError, RunError
from tailcut.fidelity import monitor as fidelity_monitor
from tailcut.fidelity import verdict as fidelity_verdict
from tailcut.net import build, rtt, topology
from tailcut.net.topology import Topology
from tailcut import innetwork, transports
from tailcut.transports import rxfast
from tailcut.datapath import bcc, dropper
from tailcut.reports import runmetrics
from tailcut.runtime import background, forked, overheads, procs, record, rolefork
from tailcut.spec import transport_kinds
from tailcut.spec.model import TrainingJob
from tailcut.training import cpustats, delivery, exits, tcpstats

LOG_TAIL_LINES = 15
ROLE_EXIT_S = 10    # how long a role may take to exit after the PS reported done
LEADER_EXIT_S = 2   # how long the runner waits for the PS to exit before its teardown
DIAGNOSE_WAIT_S = 5  # how long a failure waits for its root cause to exit (see _diagnose)
RTT_FIRST_SAMPLE_S = 0.5   # with a delay: TCP's RTTs read this far into training,
RTT_SAMPLE_EVERY_S = 2.0   # then this often until it ends


_runs_before: list[str] = []   # the jobs this process ran before: see _run's "startup"


@dataclass(frozen=True)
class RunResult:
    job: str
    results_dir: str
    converged: bool
    jct_s: float
    epochs: int
    iterations: int
    final_accuracy: float
    final_loss: float
    # the job's totals over its pods' namespaces (tailcut.training.tcpstats); None
    # when no role reported them
    tcp_retrans_segs: Optional[int] = None
    tcp_rto_timeouts: Optional[int] = None
    # whether the run measured the network or the host (tailcut.fidelity.verdict)
    fidelity: Optional[dict[str, Any]] = None


def run(job: TrainingJob, results_dir: Path,
        progress: Callable[[str], None] = print,
        ahead: Optional[dict[str, rolefork.PendingRole]] = None) -> RunResult:
    """Run `job` to completion and write its results under `results_dir`. `ahead`:
    its roles' processes, forked already (rolefork.ahead_of); by default forked here,
    before the network is built."""
    pending = rolefork.ahead_of(job) if ahead is None else ahead
    state = "failed"
    try:
        record.start(results_dir, job.name)
        result = _run(job, results_dir, progress, pending)
        state = "finished" if result.converged or job.spec.training.target_accuracy is None \
            else "target-not-reached"
        record.finish(results_dir, state, jct_s=result.jct_s,
                      fidelity=(result.fidelity or {}).get("verdict"))
        return result
    except (KeyboardInterrupt, SystemExit):
        state = "interrupted"
        raise
    finally:
        if state in ("failed", "interrupted"):
            record.finish(results_dir, state)
        for role in pending.values():   # the run failed before it started them
            role.abandon()


def _run(job: TrainingJob, results_dir: Path, progress: Callable[[str], None],
         pending: dict[str, rolefork.PendingRole]) -> RunResult:
    phases = overheads.Phases()
    # the process's start is this run's only when it is the process's first run (not
    # the second of `tailcut compare` or a bench)
    phases.add("startup", overheads.process_age_s() if not _runs_before else 0.0)
    _runs_before.append(job.name)
    setup_started = time.monotonic()
    compiled_before = bcc.compile_seconds()
    if os.geteuid() != 0:
        raise RunError("the local runtime needs root (it creates network namespaces); "
                       "run as root or through sudo")
    plan.check(job, "local", features.netem)
    topo = topology.plan(job)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "logs").mkdir(exist_ok=True)
    (results_dir / "spec.yaml").write_text(
        yaml.safe_dump(job.model_dump(by_alias=True, mode="json"), sort_keys=False))
    _write_json(results_dir / "topology.json",
                {"job": topo.job, "spine": topo.spine_netns,
                 "racks": [{"name": r.name, "netns": r.netns, "subnet": r.subnet,
                            "pods": [asdict(p) for p in r.pods]} for r in topo.racks]})

    has_netem = features.netem().available
    delay = {"netem": has_netem,
             "round_trip_ms": 4 * (topo.access_link.delay_ms + topo.uplink.delay_ms)}
    progress(f"building network for {job.name}: {len(topo.pods)} pods in "
             f"{len(topo.racks)} rack(s) ({'netem' if has_netem else 'no netem'})")
    with procs.terminate_as_exit():
        network = build.build(topo, has_netem, droppers=dropper)
        phases.add("network_build", time.monotonic() - setup_started)
        datapath_started = time.monotonic()
        first_pod, first_rack = topo.pods[0], topo.racks[0]
        progress(f"access links: {network.access_link_summary(first_pod)}; uplinks: "
                 f"{network.applied[f'{first_rack.netns}/up']}")
        if transport_kinds.get(job.spec.transport.type).datagrams:
            progress(f"datagram send and receive paths: {rxfast.status()}")
        running: list[procs.Process] = []
        bg: Optional[background.Background] = None
        watch = fidelity_monitor.Monitor(network.rate_bit, delay)
        # Teardown in reverse order of setup; each step runs even if one after it
        # (registered later) failed, and the namespaces always go last.
        with contextlib.ExitStack() as teardown:
            teardown.callback(network.destroy)
            _write_json(results_dir / "network.json", {"applied": network.applied,
                                                       "bridges": network.bridges})
            scheduled = _enforce(job, topo, progress)
            if scheduled is not None:  # before the namespaces go: counts, then detach
                teardown.callback(scheduled.detach)
                teardown.callback(_add_to_network_json, results_dir, "scheduling",
                                  lambda: _scheduling_summary(scheduled))
            tor = plan.in_network(job)   # the hot set chosen once, for roles and ToR
            programs = innetwork.start(job, tor, network)
            if programs:   # before the namespaces go: counters, then detach
                teardown.callback(_detach_programs, programs)
                for feature in programs:
                    teardown.callback(_add_to_network_json, results_dir, feature.name,
                                      feature.summary)
                    progress(feature.describe())

            teardown.callback(watch.stop)   # before the namespaces go, on any exit

            def stop_roles() -> None:
                for proc in running:
                    procs.stop(proc)
                if bg is not None:  # the background ends with the job, whatever ended it
                    progress(background.describe(bg.stop()))
                _record_network(network, results_dir)
            teardown.callback(stop_roles)
            bg = background.start(job, topo, results_dir, progress)
            launched = time.monotonic()
            phases.add("datapath", launched - datapath_started)
            started = _launch(job, topo, results_dir, running, tor, pending)
            report_imports = threading.Thread(target=_import_report, args=(job,),
                                              daemon=True)
            readers: list[threading.Thread] = []

            rtts: list[rtt.Comparison] = []   # with a delay: what TCP measured
            trained = threading.Event()

            def read_rtts() -> None:
                # a connection's least RTT is the least so far: read it until the end
                # (the first time soon: a short job may train for a second or two)
                wait = RTT_FIRST_SAMPLE_S
                while not trained.wait(wait):
                    rtts.extend(rtt.sample(topo))
                    wait = RTT_SAMPLE_EVERY_S

            def training_started() -> None:
                # the job's processes: its roles and its background load, and this
                # runner (not what else this process started: a test's, a bench's)
                watch.start({proc.pid for proc in running}
                            | (bg.pids() if bg is not None else set()))
                report_imports.start()
                if delay["round_trip_ms"]:
                    threading.Thread(target=read_rtts, name="rtt", daemon=True).start()
            done = _watch(job, started, results_dir, progress, on_start=training_started,
                          readers=readers)
            fidelity = watch.stop()
            trained.set()
            finished = time.monotonic()
            phases.add("training", float(done["jct_s"]))
            phases.add("role_start", finished - launched - float(done["jct_s"]))
            for name, proc in started.items():
                if name not in (plan.leader(job), "replica-0"):
                    try:
                        proc.wait(timeout=ROLE_EXIT_S)
                    except subprocess.TimeoutExpired:  # the result stands; say who hung
                        proc.send_signal(signal.SIGUSR1)  # its threads' stacks, to its log
                        time.sleep(0.5)
                        progress(f"warning: {name} was still running {ROLE_EXIT_S} s after "
                                 f"the PS finished; stopped it (its stacks are at the end "
                                 f"of logs/{name}.log)")
            _await_leaders(job, started, readers)
            teardown_started = time.monotonic()
            phases.add("role_exit", teardown_started - finished)
            if report_imports.is_alive():   # now it is what we wait for: full priority
                _renice(report_imports, 0)
                report_imports.join()
            # Every role has written its files. The dissection's figures, the most of
            # the report, draw in two forked children while this process
            # tears the network down, sums the counters and flows and draws loss.png
            # (a process with threads left, e.g. the background load's, draws them
            # itself when it asks for the result).
            figures = _start_figures(job, results_dir)
        phases.add("bpf_compile", bcc.compile_seconds() - compiled_before)
    report_started = time.monotonic()
    phases.add("teardown", report_started - teardown_started)

    scheduling = _flows_summary(job, results_dir, progress)
    extra: dict[str, Any] = {}
    if delay["round_trip_ms"]:   # the delay emulated, beside what TCP measured
        extra["rtt"] = rtt.report(rtts)
        progress(rtt.describe(rtts))
    metrics = runmetrics.build(job, done, results_dir, backend="local", fidelity=fidelity,
                               scheduling=scheduling, extra=extra)
    result = RunResult(**{f.name: metrics[f.name] for f in fields(RunResult)})
    runmetrics.write(results_dir, metrics)
    if "delivery" in metrics:
        progress(delivery.describe(metrics["delivery"], job.spec.transport.type))
    progress(("control channel " if "delivery" in metrics else "")
             + tcpstats.describe(metrics["tcp_counters"]))
    progress(cpustats.describe(metrics["cpu"]))
    for line in fidelity_verdict.describe(fidelity):
        progress(line)
    if done.get("takeover"):
        t = done["takeover"]
        progress(f"replica-0 took over from ps-0 at iteration {t['iteration']}, "
                 f"{t['at_s']:.2f} s into training")
    epochs_csv = results_dir / "epochs.csv"
    if result.epochs > 0 and epochs_csv.exists():
        from tailcut.reports import plots
        plots.plot_loss_vs_epoch(
            epochs_csv, results_dir / "loss.png",
            title=f"{job.name}: {job.spec.training.model} over {job.spec.transport.type}")
    for line in _figure_lines(job, results_dir, figures):
        progress(line)
    if result.epochs == 0:
        progress("no epoch completed (spec.training.iterations is below one epoch): "
                 "loss.png not drawn")
    phases.add("report", time.monotonic() - report_started)
    summary = phases.summary()
    runmetrics.write(results_dir, {**metrics, "overhead_s": summary})
    progress(overheads.describe(summary))
    return result


def _launch(job: TrainingJob, topo: Topology, results_dir: Path,
            running: list[procs.Process], tor: innetwork.Sections,
            pending: dict[str, rolefork.PendingRole]) -> dict[str, procs.Process]:
    """Start every role in its pod; return them by pod name. The PS shard 0 and the
    replica write JSON events on stdout (piped); the others only log. The processes
    forked ahead (`pending`) when there are, else forks of this process when it can
    (rolefork: no imports to wait for), else new interpreters."""
    env = {**os.environ, **rolefork.BLAS_THREADS, "PYTHONUNBUFFERED": "1"}
    fork = rolefork.enabled() and procs.single_threaded()
    if fork and job.spec.transport.type in transports.names():
        transports.load(job.spec.transport.type)   # imported once here, not in each role
    roles: dict[str, procs.Process] = {}
    for pod in topo.pods:
        if pod.role in topology.BACKGROUND_ROLES:
            continue  # started by tailcut.runtime.background
        config_path = results_dir / "logs" / f"{pod.name}.json"
        log_path = results_dir / "logs" / f"{pod.name}.log"
        plan.role_config(job, pod.name, str(results_dir), plan.hosts(topo),
                         tor=tor).to_json(config_path)
        piped = pod.name in (plan.leader(job), "replica-0")
        proc: procs.Process
        if pod.name in pending:
            proc = pending.pop(pod.name).start(str(config_path), piped, str(log_path))
        elif fork:
            proc = rolefork.start(pod.netns, str(config_path), piped, str(log_path))
        else:
            argv = [sys.executable, "-m", "tailcut.training.role", str(config_path)]
            with open(log_path, "wb") as log:
                proc = procs.spawn(pod.netns, argv, stdout=subprocess.PIPE if piped else log,
                                   stderr=log, env=env)
        running.append(proc)
        roles[pod.name] = proc
    return roles


def _watch(job: TrainingJob, roles: dict[str, procs.Process], results_dir: Path,
           progress: Callable[[str], None],
           on_start: Callable[[], None] = lambda: None,
           readers: Optional[list[threading.Thread]] = None) -> dict[str, Any]:
    """Follow the PS's JSON events until it reports done; fail fast if any role dies.
    With a replica, ps-0 may die: then follow the replica's events instead. The
    leader's first "start" event (training begins) calls `on_start`. The threads that
    read the events are added to `readers`."""
    events: "queue.Queue[tuple[str, Optional[dict[str, Any]]]]" = queue.Queue()
    first = plan.leader(job)   # ps-0, or worker-0 (rank 0) with syncMode allreduce
    _start_readers(roles, (first, "replica-0"), events, readers)
    has_replica = "replica-0" in roles
    leader = first
    t = job.spec.training
    deadline = time.monotonic() + t.timeout_s + 30  # the PS enforces timeout_s itself
    started = False
    while True:
        _check_alive(job, roles, results_dir, first, deadline)
        leader = _leader_now(roles, leader, has_replica, progress)
        try:
            source, event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        kind = event.get("event") if event else None
        if source != leader:
            if not _replica_takes_over(roles, results_dir, progress, source, event, leader):
                continue
            leader = "replica-0"
        if event is None or kind == "error":
            if leader == "ps-0" and has_replica:
                continue  # ps-0 died: _leader_now hands over once its status is in
            raise RunError(_diagnose(roles, results_dir, event))
        if kind == "epoch":
            progress(_epoch_line(event, t.epochs))
        elif kind == "start" and not started:
            started = True
            on_start()
        elif kind == "takeover":
            progress(f"replica-0 took over at iteration {event['iteration']}")
        elif kind == "done":
            return event


def _start_readers(roles: dict[str, procs.Process], names: tuple[str, ...],
                   events: "queue.Queue[tuple[str, Optional[dict[str, Any]]]]",
                   readers: Optional[list[threading.Thread]]) -> None:
    """Read the events of the named roles that run into `events`, each in a thread
    (added to `readers`)."""
    for name in names:
        if name in roles:
            reader = threading.Thread(target=_read_events, args=(name, roles[name], events),
                                      daemon=True)
            reader.start()
            if readers is not None:
                readers.append(reader)


def _check_alive(job: TrainingJob, roles: dict[str, procs.Process], results_dir: Path,
                 first: str, deadline: float) -> None:
    """Raise a RunError once the run is past `deadline`, or once a role whose events
    are not followed has failed (the followed ones report their own failure)."""
    t = job.spec.training
    if time.monotonic() > deadline:
        raise RunError(f"{job.name}: no result after {t.timeout_s:g} s "
                       "(spec.training.timeoutS); logs in " + str(results_dir / "logs"))
    others = {n: p for n, p in roles.items() if n not in (first, "replica-0")}
    if any(p.poll() not in (None, 0) for p in others.values()):
        raise RunError(_diagnose(roles, results_dir, None))


def _leader_now(roles: dict[str, procs.Process], leader: str, has_replica: bool,
                progress: Callable[[str], None]) -> str:
    """The role whose events to follow: replica-0 once ps-0 has failed, with a replica."""
    if leader == "ps-0" and has_replica and roles["ps-0"].poll() not in (None, 0):
        progress(f"ps-0 exited with code {roles['ps-0'].poll()}; the replica takes over")
        return "replica-0"
    return leader


def _replica_takes_over(roles: dict[str, procs.Process], results_dir: Path,
                        progress: Callable[[str], None], source: str,
                        event: Optional[dict[str, Any]], leader: str) -> bool:
    """Whether an event from a role that does not lead makes replica-0 the leader (its
    "takeover"). Any other is not followed: the replica's failure is reported (ps-0
    carries on without it), the primary's last words after a take-over are ignored."""
    kind = event.get("event") if event else None
    if source == "replica-0" and kind == "takeover":
        return True
    if source == "replica-0" and (event is None or kind == "error"):
        if leader == "replica-0":
            raise RunError(_diagnose(roles, results_dir, event))
        progress("replica-0 failed; ps-0 carries on without it")
    return False


def _epoch_line(event: dict[str, Any], epochs: int) -> str:
    """The progress line of an "epoch" event."""
    return (f"epoch {event['epoch']:>3}/{epochs}  iteration {event['iteration']:>5}"
            f"  train loss {event['train_loss']:.4f}  test loss {event['test_loss']:.4f}"
            f"  test accuracy {event['test_accuracy']:.3f}  {event['elapsed_s']:.1f} s")


def _await_leaders(job: TrainingJob, roles: dict[str, procs.Process],
                   readers: list[threading.Thread]) -> None:
    """Let the roles whose events were followed exit (they reported done with their
    files written) and their readers see the end of their output: briefly, for a role
    that lingers is stopped in the teardown anyway."""
    for name in (plan.leader(job), "replica-0"):
        if name in roles:
            try:
                roles[name].wait(timeout=LEADER_EXIT_S)
            except subprocess.TimeoutExpired:
                return
    for reader in readers:
        reader.join(timeout=LEADER_EXIT_S)


def _diagnose(roles: dict[str, procs.Process], results_dir: Path,
              ps_event: Optional[dict[str, Any]]) -> str:
    """Name the role that failed first. A role that exits with EXIT_PEER_GONE only saw
    another one go away, so any other failure is the root cause: while only victims
    have exited, wait up to DIAGNOSE_WAIT_S for the culprit (a failing role closes its
    connections before it has written its logs and exited). If none comes, every
    victim's last log line is given, and the roles that had already ended cleanly."""
    waited_until = time.monotonic() + DIAGNOSE_WAIT_S
    while True:
        codes = {name: p.poll() for name, p in roles.items()}
        failed = [(name, code) for name, code in codes.items()
                  if code is not None and code != 0]
        failed.sort(key=lambda item: item[1] == exits.PEER_GONE)
        culprit = bool(failed) and failed[0][1] != exits.PEER_GONE
        if culprit or time.monotonic() > waited_until:
            break
        time.sleep(0.1)
    if failed:
        name, code = failed[0]
        how = f" (killed by {signal.Signals(-code).name})" if code < 0 else ""
        said = f"{name} exited with code {code}{how}:\n" + \
            _tail(results_dir / "logs" / f"{name}.log")
        if code != exits.PEER_GONE:
            return said
        # Only victims: each one's last words, and who had ended cleanly, to find who left
        others = [f"{other} exited with code {c}: " + _last_line(results_dir / "logs"
                                                                  / f"{other}.log")
                  for other, c in failed[1:]]
        others += [f"{other} had already exited cleanly"
                   for other, c in sorted(codes.items()) if c == 0]
        return "\n".join([said, *others])
    if ps_event is not None:
        return f"{ps_event.get('role', 'ps')}-{ps_event.get('index', 0)}: " \
               f"{ps_event.get('message')}"
    return "the leading role (ps-0, or worker-0 under allreduce) closed its output before " \
           "finishing; logs in " + str(results_dir / "logs")


def _read_events(name: str, proc: procs.Process,
                 events: "queue.Queue[tuple[str, Optional[dict[str, Any]]]]") -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            events.put((name, json.loads(line)))
        except json.JSONDecodeError:
            continue  # a stray print is not an event
    events.put((name, None))


def _import_report(job: TrainingJob) -> None:
    """Import what the report needs (matplotlib: ~0.7 s of CPU) in a thread while the
    job trains: its iterations wait on the network far more than on the CPU, and the
    report then starts drawing at once instead of after the import. At nice 19, so
    that it takes only CPU time the roles leave: at nice 0 it lengthened the JCT by
    ~0.4 s on a busy machine (bench/run_overhead.py). A failed import is raised again
    where the report imports the module."""
    _renice(threading.current_thread(), 19)
    try:
        if not job.spec.training.mode.has_ps:
            from tailcut.reports import allreduce_report  # noqa: F401
        else:
            from tailcut.reports import dissection  # noqa: F401
        from tailcut.reports import plots  # noqa: F401
        from tailcut.scheduling import flowreport  # noqa: F401
    except Exception:   # noqa: BLE001 - the report's own import says what failed
        pass


def _renice(thread: threading.Thread, nice: int) -> None:
    """Give `thread` (a Linux task of its own) niceness `nice`; quietly not, if refused."""
    if thread.native_id is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, thread.native_id, nice)
        except OSError:
            pass


def _start_figures(job: TrainingJob, results_dir: Path) -> list[forked.Call[Any]]:
    """Start drawing the dissection's figures (or the all-reduce report) in forked
    children: the dissection in two halves (its PARTS), so that they and this process's
    own share of the report keep both cores busy."""
    if not job.spec.training.mode.has_ps:
        return [forked.call(_allreduce_lines, job, results_dir)]
    from tailcut.reports import dissection  # here: matplotlib is slow to import
    return [forked.call(_dissection_part, part, results_dir, job.name)
            for part in dissection.PARTS]


def _figure_lines(job: TrainingJob, results_dir: Path,
                  started: list[forked.Call[Any]]) -> list[str]:
    """Wait for the figures; the lines that say what was written (or why not)."""
    if not job.spec.training.mode.has_ps:
        return started[0].result()   # type: ignore[no-any-return]
    from tailcut.reports import dissection
    parts = [call.result() for call in started]
    refused = [part for part in parts if isinstance(part, str)]
    if refused:   # a run whose logs cannot be cut still succeeds
        return [f"no dissection report: {refused[0]}"]
    written = dissection.write_summary(results_dir, parts)
    return ["dissection: " + ", ".join(p.name for p in written)]


def _dissection_part(part: Callable[..., Any], results_dir: Path,
                     title: str) -> Any:
    """One of dissection.PARTS: (paths, numbers), or why it could not be drawn."""
    try:
        return part(results_dir, title=title)
    except (OSError, ValueError) as err:
        return str(err)


def _allreduce_lines(job: TrainingJob, results_dir: Path) -> list[str]:
    lines: list[str] = []
    _allreduce_report(job, results_dir, lines.append)
    return lines


def _allreduce_report(job: TrainingJob, results_dir: Path,
                      progress: Callable[[str], None]) -> None:
    """allreduce.json (per-iteration all-reduce percentiles) and allreduce.png."""
    from tailcut.reports import allreduce_report  # here: matplotlib is slow to import
    try:
        summary = allreduce_report.report(results_dir, job.spec.replicas.workers,
                                          title=job.name)
    except (OSError, ValueError) as err:
        progress(f"no all-reduce report: {err}")
        return
    progress(allreduce_report.describe(summary))


def _record_network(network: build.Network, results_dir: Path) -> None:
    passed, dropped = network.dropper_counts()
    queue_drops = network.queue_drops()   # full buffers: apart from the random loss
    _write_json(results_dir / "network.json",
                {"applied": network.applied, "bridges": network.bridges,
                 "ebpf_dropper": {"passed": passed, "dropped": dropped},
                 "queue_drops": {"total": sum(queue_drops.values()),
                                 "by_link_end": queue_drops},
                 "pod_links": network.pod_link_bytes()})


# --- CadentFlow (issue 6): priority classes on every pod, per-tensor FCTs -------------
def _enforce(job: TrainingJob, topo: Topology,
             progress: Callable[[str], None]) -> Any:
    """Priority classes and the DSCP classifier on every shaped egress (cadentflow)."""
    from tailcut.scheduling import enforce

    handle = enforce.apply(topo, job.spec.scheduling)
    if handle.classifiers:
        progress(f"cadentflow: {job.spec.scheduling.priority_levels} priority classes and "
                 f"the DSCP classifier on {len(handle.classifiers)} egresses")
    return handle


def _add_to_network_json(results_dir: Path, key: str, value_of: Callable[[], Any]) -> None:
    """Add ``key``: value_of() to network.json. Registered as a teardown step, so the
    value (the datapath's counters) is read as the run ends, before it is detached."""
    path = results_dir / "network.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value_of()
    _write_json(path, data)


def _detach_programs(programs: list[innetwork.TorFeature]) -> None:
    errors = innetwork.detach(programs)
    if errors:
        raise DatapathError("; ".join(errors))


def _scheduling_summary(handle: Any) -> dict[str, Any]:
    """The classes and per-level packet counts, for network.json."""
    return {"policy": handle.policy, "classes": handle.applied,
            "classified": {where: {("untagged" if lvl is None else str(lvl)): list(pb)
                                   for lvl, pb in by_level.items()}
                           for where, by_level in handle.counts().items()}}


def _flows_summary(job: TrainingJob, results_dir: Path,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    from tailcut.scheduling import flowreport

    summary = flowreport.summarize(results_dir, job.spec.scheduling.policy)
    _write_json(results_dir / "flows.json", summary)
    progress(flowreport.describe(summary))
    return summary


def _last_line(path: Path) -> str:
    lines = _tail(path).strip().splitlines()
    return lines[-1].strip() if lines else "(no log)"


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in lines[-LOG_TAIL_LINES:])


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")



