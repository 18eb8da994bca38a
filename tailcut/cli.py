"""The `tailcut` command: run, validate, clean and doctor."""

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

from tailcut import spec
from tailcut.errors import SpecError, TailcutError


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SpecError as err:
        print(f"tailcut: {err}", file=sys.stderr)
        return 2
    except TailcutError as err:
        print(f"tailcut: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tailcut: interrupted; the job's network was removed", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailcut", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a TrainingJob on this host (needs root)")
    run.add_argument("job", help="TrainingJob YAML file")
    run.add_argument("--results-dir", type=Path,
                     help="where to write results (default: results/<job>-<time>)")
    run.set_defaults(handler=_run)

    validate = sub.add_parser("validate", help="check a TrainingJob file without running it")
    validate.add_argument("job", nargs="+", help="TrainingJob YAML file(s)")
    validate.set_defaults(handler=_validate)

    clean = sub.add_parser("clean", help="remove what killed runs left behind")
    clean.add_argument("job", nargs="?", help="only this job (default: every tailcut job)")
    clean.set_defaults(handler=_clean)

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

    from tailcut.simulate import cli as simulate_cli
    simulate_cli.add_parser(sub)
    decode = sub.add_parser("decode", help="print the bounded-loss packets of a pcap capture")
    decode.add_argument("pcap", type=Path, help="capture written by tcpdump -w")
    decode.add_argument("--message", type=lambda v: int(v, 0),
                        help="message id to dump (default: the first in the capture)")
    decode.add_argument("--port", type=int, help="only datagrams to this UDP port")
    decode.set_defaults(handler=_decode)
    return parser


def _run(args: argparse.Namespace) -> int:
    from tailcut.runtime import local
    job = spec.load_file(args.job)
    out = args.results_dir or Path("results") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = local.run(job, out, progress=lambda line: print(line, flush=True))
    target = job.spec.training.target_accuracy
    print(f"\n{job.name}: JCT {result.jct_s:.1f} s, {result.epochs} epochs "
          f"({result.iterations} iterations), final test accuracy "
          f"{result.final_accuracy:.3f}, final test loss {result.final_loss:.4f}")
    print(f"results: {result.results_dir}")
    if target is not None and not result.converged:
        print(f"tailcut: the job ended without reaching targetAccuracy={target}",
              file=sys.stderr)
        return 1
    return 0


def _validate(args: argparse.Namespace) -> int:
    for path in args.job:
        job = spec.load_file(path)
        s = job.spec
        print(f"{path}: ok: job {job.name}, {s.replicas.parameter_servers} PS + "
              f"{s.replicas.workers} workers in {len(s.network.racks)} rack(s), "
              f"model {s.training.model}, transport {s.transport.type}")
    return 0


def _clean(args: argparse.Namespace) -> int:
    from tailcut.net import clean
    removed = clean.remove_job(args.job) if args.job else clean.remove_all()
    for name in removed:
        print(f"removed {name}")
    print(f"clean: {len(removed)} namespace(s) removed")
    return 0


def _background(args: argparse.Namespace) -> int:
    from tailcut.runtime import background
    job = spec.load_file(args.job)
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
    job = spec.load_file(args.job)
    out = args.results_dir or Path("results") / f"{job.name}-ui-{time.strftime('%Y%m%d-%H%M%S')}"
    webui.run(job, args.port, args.max_s, out, progress=lambda line: print(line, flush=True))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from tailcut import doctor
    return doctor.main()


def _crd(args: argparse.Namespace) -> int:
    from tailcut.k8s import crd
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
        found = decode.dump(args.pcap, sys.stdout, message=args.message, port=args.port)
    except (OSError, decode.PcapError) as err:
        print(f"tailcut decode: {err}", file=sys.stderr)
        return 2
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
