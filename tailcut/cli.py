"""The `tailcut` command: a testbed for ML-aware network transport. Run a TrainingJob
on this host or on Kubernetes, compare transports, reproduce the papers' results; one
subcommand for each, listed below (`tailcut COMMAND --help` for its options)."""

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from tailcut import errors
from tailcut.errors import SpecError, TailcutError

if TYPE_CHECKING:
    from tailcut.spec import TrainingJob


def main(argv: Optional[list[str]] = None) -> int:
    """The command line `argv` (default: this process's, as the `tailcut` command)."""
    entry = argv is None   # the process's own command: it ends when this returns
    argv = sys.argv[1:] if argv is None else argv
    if entry and argv[:1] == ["run"]:
        # The imports ahead make ~10^5 objects that live as long as the process; the
        # collector's passes over them while they are made cost ~0.06 s of CPU and
        # free nothing. Off until _run has them all (it turns it on again).
        gc.disable()
    # A command of this file needs none of the others' modules: the Kubernetes
    # commands alone take ~0.3 s to import, paid on every `tailcut run` otherwise.
    args = _parser(lean=bool(argv) and argv[0] in CORE_COMMANDS).parse_args(argv)
    try:
        return _handle(args)
    finally:
        if entry:
            # The process ends next. Its interpreter's shutdown would walk every object
            # it holds (numpy, pydantic, matplotlib, pyroute2: ~10^5) in a last garbage
            # collection, ~0.3-0.5 s of each `tailcut run` (bench/run_overhead.py) that
            # frees nothing the kernel would not. Frozen, they are left to the exit;
            # atexit handlers and the flushing of files still run.
            gc.freeze()


def _handle(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except SpecError as err:
        print(f"tailcut: {err}", file=sys.stderr)
        return errors.EXIT_SPEC
    except TailcutError as err:
        print(f"tailcut: error: {err}", file=sys.stderr)
        return errors.EXIT_FAILED
    except KeyboardInterrupt:
        print("tailcut: interrupted; the job's network was removed", file=sys.stderr)
        return errors.EXIT_INTERRUPTED


CORE_COMMANDS = ("run", "validate", "clean", "net", "background", "background-ui", "doctor",
                 "crd", "decode", "models", "sweep", "compare", "calibrate")


def _parser(lean: bool = False) -> argparse.ArgumentParser:
    """Every command's parser; with `lean`, only those defined in this file."""
    parser = argparse.ArgumentParser(prog="tailcut", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a TrainingJob on this host (needs root)")
    run.add_argument("job", help="TrainingJob YAML file")
    run.add_argument("--results-dir", type=Path,
                     help="where to write results (default: results/<job>-<time>); "
                          "one that holds a run's results already is refused")
    run.add_argument("--require-fidelity", action="store_true",
                     help="exit 4, naming the evidence, unless the run was network-bound "
                          "(its fidelity verdict: the host had cores to spare and every "
                          "backlogged link sent at its rate)")
    run.set_defaults(handler=_run)
    # Defined in their own modules, which import nothing heavy until they run.
    from tailcut.runtime import calibrate, compare
    compare.add_parser(sub)
    calibrate.add_parser(sub)

    validate = sub.add_parser("validate", help="check a TrainingJob file without running it")
    validate.add_argument("job", nargs="+", help="TrainingJob YAML file(s)")
    validate.add_argument("--executor", choices=("local", "kubernetes"), default="local",
                          help="refuse what this executor cannot build: local (`tailcut "
                               "run`, the default) or kubernetes (the operator's pods); "
                               "what the other one refuses is printed as a note")
    validate.set_defaults(handler=_validate)

    clean = sub.add_parser("clean", help="remove what killed runs left behind")
    clean.add_argument("job", nargs="?", help="only this job (default: every tailcut job)")
    clean.set_defaults(handler=_clean)

    net = sub.add_parser("net", help="build, show or remove a job's network without "
                                     "training it (needs root)")
    net_sub = net.add_subparsers(required=True, metavar="ACTION")
    net_up = net_sub.add_parser("up", help="build the job's network and leave it up")
    net_up.add_argument("job", help="TrainingJob YAML file")
    net_up.set_defaults(handler=_net_up)
    net_show = net_sub.add_parser("show", help="list the job's pods, addresses, namespaces")
    net_show.add_argument("job", help="TrainingJob YAML file")
    net_show.set_defaults(handler=_net_show)
    net_down = net_sub.add_parser("down", help="remove the job's network")
    net_down.add_argument("job", help="TrainingJob YAML file, or the job's name")
    net_down.set_defaults(handler=_net_down)

    bg = sub.add_parser("background",
                        help="build a job's network and run only its backgroundLoad")
    bg.add_argument("job", help="TrainingJob YAML file with spec.backgroundLoad")
    bg.add_argument("--results-dir", type=Path,
                    help="where to write results (default: results/<job>-bg-<time>)")
    bg.set_defaults(handler=_background)

    ui = sub.add_parser("background-ui",
                        help="Locust's web UI against a running job, to change load by hand")
    ui.add_argument("job", help="the running TrainingJob's YAML file (with backgroundLoad)")
    ui.add_argument("--port", type=int, default=8089, help="host port of the web UI")
    ui.add_argument("--max-s", type=float, default=3600.0, help="stop after this long")
    ui.add_argument("--results-dir", type=Path,
                    help="where Locust's CSVs go (default: results/<job>-ui-<time>)")
    ui.set_defaults(handler=_background_ui)

    doctor = sub.add_parser("doctor", help="what this kernel and machine support")
    doctor.set_defaults(handler=_doctor)

    crd = sub.add_parser("crd", help="print the TrainingJob CRD generated from the spec models")
    crd.add_argument("--write", action="store_true",
                     help="write it to manifests/crd.yaml and the Helm chart's crds/")
    crd.set_defaults(handler=_crd)

    if not lean:
        from tailcut.simulate import cli as simulate_cli
        simulate_cli.add_parser(sub)
        from tailcut.reproduce import cli as reproduce_cli
        reproduce_cli.add_parser(sub)
    decode = sub.add_parser("decode", help="print the bounded-loss packets of a pcap capture")
    decode.add_argument("pcap", type=Path, help="capture written by tcpdump -w")
    decode.add_argument("--message", type=lambda v: int(v, 0),
                        help="message id to dump (default: the first in the capture)")
    decode.add_argument("--port", type=int, help="only datagrams to this UDP port")
    decode.add_argument("--to", metavar="ADDRESS",
                        help="the receiver (address or address:port) of the copy to dump, "
                             "where one message went to several (the PS's model)")
    decode.set_defaults(handler=_decode)
    _add_model_commands(sub)
    if not lean:
        from tailcut.k8s import cli as k8s_cli
        k8s_cli.add_parsers(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    # Before numpy loads: one BLAS thread, here and so in the roles, forks of this
    # process (tailcut.runtime.rolefork); a BLAS thread pool would rule forking out.
    blas_first = "numpy" not in sys.modules
    os.environ.update({v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                        "MKL_NUM_THREADS")})
    from tailcut.runtime import rolefork   # the roles' modules (numpy, training)
    rolefork.enable(numpy_loaded_after=blas_first)
    job = _load(args.job)
    # The roles' processes, forked before the runner's own imports (pyroute2, the
    # network and the datapath): they load their datasets on the other core meanwhile.
    # (Other jobs' roles are forked by local.run, after those imports.)
    ahead = rolefork.ahead_of(job) if rolefork.needs_no_more_imports(job) else None
    from tailcut.runtime import local
    from tailcut.spec import transport_kinds
    if not gc.isenabled():   # main turned it off for the imports: they are in
        gc.freeze()   # and stay as long as the process: never scanned again
        gc.enable()
    out = args.results_dir or Path("results") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = local.run(job, out, progress=lambda line: print(line, flush=True), ahead=ahead)
    target = job.spec.training.target_accuracy
    which = ("control channel TCP" if transport_kinds.get(job.spec.transport.type).datagrams
             else "TCP")
    tcp = ("" if result.tcp_retrans_segs is None else
           f"; {which}: {result.tcp_retrans_segs} segments retransmitted, "
           f"{result.tcp_rto_timeouts} RTO timeouts")
    verdict = (result.fidelity or {}).get("verdict")
    print(f"\n{job.name}: JCT {result.jct_s:.1f} s, {result.epochs} epochs "
          f"({result.iterations} iterations), final test accuracy "
          f"{result.final_accuracy:.3f}, final test loss {result.final_loss:.4f}{tcp}; "
          f"{verdict or 'no fidelity verdict'}")
    print(f"results: {result.results_dir}")
    if target is not None and not result.converged:
        print(f"tailcut: the job finished without reaching targetAccuracy={target}",
              file=sys.stderr)
        return errors.EXIT_TARGET_NOT_REACHED
    fidelity = result.fidelity or {}
    if args.require_fidelity and fidelity.get("verdict") != "network-bound":
        why = "; ".join(fidelity.get("reasons") or ["no verdict"])
        print(f"tailcut: --require-fidelity: the run was {fidelity.get('verdict')}, not "
              f"network-bound: {why}", file=sys.stderr)
        return errors.EXIT_NOT_NETWORK_BOUND
    return errors.EXIT_FINISHED


def _load(path: str) -> "TrainingJob":
    from tailcut import spec   # here: pydantic's models are a quarter second to import
    return spec.load_file(path)


def _validate(args: argparse.Namespace) -> int:
    from tailcut import features, plan   # the refusals `tailcut run` and the operator apply
    chosen: plan.Executor = args.executor
    other: plan.Executor = "kubernetes" if chosen == "local" else "local"
    for path in args.job:
        job = _load(path)
        s = job.spec
        refused = plan.refusals(job, chosen, features.netem)
        if refused:
            raise SpecError(f"{path}: {refused[0].message}")
        if chosen == "kubernetes":
            _within_default_limits(path, job)
        roles = (f"{s.replicas.workers} workers all-reducing (no PS)"
                 if not s.training.mode.has_ps
                 else f"{s.replicas.parameter_servers} PS + {s.replicas.workers} workers")
        print(f"{path}: ok ({chosen}): job {job.name}, {roles} in "
              f"{len(s.network.racks)} rack(s), model {s.training.model}, transport "
              f"{s.transport.type}")
        for caution in plan.cautions(job, chosen, features.netem):
            print(f"  warning: {caution.message}")
        for refusal in plan.refusals(job, other, features.netem):
            print(f"  note: {other} would refuse it: {refusal.message}")
    return 0


def _within_default_limits(path: str, job: "TrainingJob") -> None:
    """What the operator refuses of a job's kernel memory and links at the chart's
    default limits (a cluster admin may set others for a namespace). Racks per node
    depend on where the pods land, unknown here: counted as one, so never refused."""
    from tailcut.k8s.manifests import limits
    refused = limits.refusal(job, 1, limits.Limits())
    if refused:
        raise SpecError(f"{path}: {refused}")


def _clean(args: argparse.Namespace) -> int:
    from tailcut.net import clean
    removed = clean.remove_job(args.job) if args.job else clean.remove_all()
    for name in removed:
        print(f"removed {name}")
    print(f"clean: {len(removed)} namespace(s) removed")
    return 0


def _net_up(args: argparse.Namespace) -> int:
    from tailcut.runtime import netonly
    netonly.up(_load(args.job), progress=lambda line: print(line, flush=True))
    return 0


def _net_show(args: argparse.Namespace) -> int:
    from tailcut.runtime import netonly
    netonly.show(_load(args.job))
    return 0


def _net_down(args: argparse.Namespace) -> int:
    from tailcut.net import naming
    from tailcut.runtime import netonly
    name = args.job
    if name.endswith((".yaml", ".yml")) or os.path.sep in name:
        name = _load(name).name
    elif not naming.valid_job_name(name):
        raise SpecError(f"net down {name!r}: neither a TrainingJob file nor a job name "
                        "(a DNS label)")
    netonly.down(name)
    return 0


def _background(args: argparse.Namespace) -> int:
    from tailcut.runtime import background
    job = _load(args.job)
    out = args.results_dir or Path("results") / f"{job.name}-bg-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = background.run_alone(job, out, progress=lambda line: print(line, flush=True))
    measured = summary.get("measured_load_factor")
    if measured is not None:
        print(f"{job.name}: measured load factor {measured:.3f} on {summary['target_link']} "
              f"(target {summary['target_load_factor']}); interface counters of "
              f"{summary['measured_at']}")
    print(f"results: {out}")
    return 0


def _background_ui(args: argparse.Namespace) -> int:
    from tailcut.runtime import webui
    job = _load(args.job)
    out = args.results_dir or Path("results") / f"{job.name}-ui-{time.strftime('%Y%m%d-%H%M%S')}"
    webui.run(job, args.port, args.max_s, out, progress=lambda line: print(line, flush=True))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from tailcut import doctor
    return doctor.main()


def _crd(args: argparse.Namespace) -> int:
    from tailcut.k8s.manifests import crd
    if not args.write:
        print(crd.render(), end="")
        return 0
    for path in crd.checked_in_paths():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(crd.render())
        print(f"wrote {path}")
    return 0
def _decode(args: argparse.Namespace) -> int:
    from tailcut.transports import decode
    try:
        found = decode.dump(args.pcap, sys.stdout, message=args.message, port=args.port,
                            to=args.to)
    except (OSError, decode.PcapError) as err:
        print(f"tailcut decode: {err}", file=sys.stderr)
        return 2
    return 0 if found else 1

# --- models and sweep (issue 4: training workloads, emulated-loss sweeps) ---

def _add_model_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    models = sub.add_parser("models", help="list the models a TrainingJob can train")
    models.set_defaults(handler=_models)

    sweep = sub.add_parser(
        "sweep", help="loss-tolerance sweep: emulated BSP training at loss rates 0, 0.05, ... "
                      "(no network, no root)")
    sweep.add_argument("--model", required=True,
                       help="a model name, several separated by commas, or 'all'")
    sweep.add_argument("--max-loss-rate", "--p-max", type=float, default=0.95,
                       help="highest loss rate tried (default 0.95); the sweep stops "
                            "earlier at the first loss rate that does not converge "
                            "(--p-max: its older name)")
    sweep.add_argument("--step", type=float, default=0.05, help="loss rate step (default 0.05)")
    sweep.add_argument("--runs", type=int, default=3,
                       help="runs (seeds 0..N-1) per loss rate; medians are reported (default 3)")
    sweep.add_argument("--workers", type=int, default=4, help="emulated workers (default 4)")
    sweep.add_argument("--granularity", choices=("packet", "coordinate"), default="packet",
                       help="lose whole packets (ranges of consecutive floats, default) or "
                            "single floats")
    sweep.add_argument("--direction", choices=("push", "pull", "both"), default="both",
                       help="which messages lose data: gradients, parameters or both (default)")
    sweep.add_argument("--range-bytes", type=int, default=1400,
                       help="payload bytes per packet for --granularity packet (default 1400)")
    sweep.add_argument("--aggregation", choices=("mean", "unbiased"), default="mean",
                       help="how the PS combines the gradient values that arrived: mean over "
                            "the workers that delivered each coordinate (default) or "
                            "unbiased (inverse-probability weighting), as "
                            "spec.training.aggregation")
    sweep.add_argument("--max-epochs", type=int,
                       help="epochs after which a run counts as not converged "
                            "(default: the model's, see `tailcut models`)")
    sweep.add_argument("--bandwidth", default="1Gbit",
                       help="PS link rate for the modelled JCT, tc style (default 1Gbit)")
    sweep.add_argument("--jobs", type=int,
                       help="runs emulated in parallel (default: one per CPU core)")
    sweep.add_argument("--results-dir", type=Path,
                       help="where to write results (default: results/sweep-<time>)")
    sweep.set_defaults(handler=_sweep)


def _models(args: argparse.Namespace) -> int:
    import numpy as np

    from tailcut.ml import models
    print(f"{'model':<8}{'params':>9}{'bytes':>10}  {'target':<8}{'lr':>6}{'batch':>6}"
          f"{'max ep':>7}  data / metric")
    for name in models.names():
        entry = models.info(name)
        model = models.create(name, models.dataset(name, 0))
        nbytes = model.num_params * np.dtype(np.float32).itemsize
        print(f"{name:<8}{model.num_params:>9}{nbytes:>10}  {entry.target_accuracy:<8g}"
              f"{entry.learning_rate:>6g}{entry.batch_size:>6}{entry.max_epochs:>7}  "
              f"{entry.data}; target = {entry.metric}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    import csv
    import json
    import os
    # One BLAS thread, as the roles use: on two cores numpy's default thread pool
    # makes these small matrix products several times slower. Only effective
    # before numpy loads, which nothing on this path has done yet.
    if "numpy" not in sys.modules:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")

    from tailcut.reports import sweep as sweep_plot
    from tailcut.spec import units
    from tailcut.ml import models
    from tailcut.training import emulate, sweep
    names = models.names() if args.model == "all" else args.model.split(",")
    for name in names:
        if name not in models.names():
            raise SpecError(f"--model {name!r}: unknown; known: {', '.join(models.names())}, all")
    try:
        bandwidth = units.parse_bandwidth(args.bandwidth)
        loss = emulate.LossModel(0.0, args.granularity, args.direction, args.range_bytes)
        sweep.loss_rates(args.step, args.max_loss_rate)
    except ValueError as err:
        raise SpecError(f"sweep: {err}") from err
    for flag in ("runs", "workers", "max_epochs", "jobs"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise SpecError(f"sweep: --{flag.replace('_', '-')}={value}: must be >= 1")
    out = args.results_dir or Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps(
        {"models": names, **{k: (str(v) if isinstance(v, Path) else v)
                             for k, v in vars(args).items() if k not in ("handler", "model")}},
        indent=2) + "\n")
    started = time.monotonic()
    points: list[dict[str, object]] = []
    table: list[dict[str, object]] = []
    for name in names:
        result = sweep.sweep(name, loss=loss, step=args.step,
                             max_loss_rate=args.max_loss_rate, runs=args.runs,
                             num_workers=args.workers, max_epochs=args.max_epochs,
                             bandwidth_bps=bandwidth, jobs=args.jobs,
                             progress=lambda m: print(m, flush=True),
                             aggregation=args.aggregation)
        points += sweep.point_rows(result)
        table.append(sweep.table_row(result))
        for rows, path, fields in ((points, out / "sweep.csv", sweep.POINT_FIELDS),
                                   (table, out / "table3.csv", sweep.TABLE_FIELDS)):
            with open(path, "w", newline="") as f:  # rewritten per model: progress survives ^C
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
    png = sweep_plot.plot_sweep(out / "sweep.csv", out / "table3.csv", out / "fig2.png")
    print(f"\nLoss tolerance (x1) and convergence bound (x2), {args.granularity} loss on "
          f"{args.direction}, {args.workers} workers, {args.aggregation} aggregation, "
          f"median of {args.runs} run(s):")
    print(sweep.format_table(table))
    print(f"\nsweep took {time.monotonic() - started:.1f} s; results: {out} "
          f"(sweep.csv, table3.csv, {png.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
