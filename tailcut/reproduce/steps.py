"""The commands a reproduction runs, one directory each, with progress and resumption.

A step is one `tailcut` command (sweep, simulate, run, ...) writing into
``<paper dir>/steps/<name>/``. When it ends, ``step.json`` records the command, its exit
code, duration and tailcut's commit. A later reproduction reuses a step whose
``step.json`` says it finished with the same command and inputs and whose required
outputs are there, even if tailcut changed since (the report shows each step's commit;
``--fresh`` runs everything again); anything else runs again from an empty directory,
so a killed step never leaves half its files to be read as results.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tailcut.errors import TailcutError

Progress = Callable[[str], None]
HEARTBEAT_S = 15.0   # how often a running step reports how far it is
OUT = "{out}"        # in a step's arguments: its directory
JOB = "{job}"        # in a step's arguments: the TrainingJob file written from Step.job


@dataclass(frozen=True)
class Step:
    name: str                    # its directory under steps/
    title: str                   # what it measures, for the terminal and the report
    args: tuple[str, ...]        # after `tailcut`; {out} and {job} are filled in
    estimate_s: float            # how long it takes on a 2-core machine (the plan's guess)
    job: Optional[str] = None    # TrainingJob YAML written to {out}/job.yaml
    needs_root: bool = False
    ok_exit_codes: tuple[int, ...] = (0,)
    # Files (under its directory) without which it failed whatever its exit code: a
    # `tailcut run` that misses its accuracy target exits 1 yet leaves its results.
    outputs: tuple[str, ...] = ()


@dataclass
class Record:
    """How a step ended: read from step.json, or just now."""
    name: str
    command: str
    exit_code: int
    seconds: float
    finished: str          # local time it ended
    reused: bool = False
    ok: bool = False
    commit: str = ""       # tailcut's git commit when it ran (a reused step: then)


@dataclass
class Clock:
    """Time left across every step of an invocation, for the progress lines."""
    left_s: float = 0.0
    started: float = field(default_factory=time.monotonic)


def directory(paper_dir: Path, step: Step) -> Path:
    return paper_dir / "steps" / step.name


def argv(step: Step, out: Path) -> list[str]:
    """The step's arguments after `tailcut`, with its directory filled in."""
    job = str(out / "job.yaml")
    return [a.replace(OUT, str(out)).replace(JOB, job) for a in step.args]


def display(step: Step, out: Path, base: Path) -> str:
    """The command as a person retypes it, paths relative to ``base``."""
    rel = os.path.relpath(out, base)
    words = [a.replace(OUT, rel).replace(JOB, f"{rel}/job.yaml") for a in step.args]
    return "tailcut " + shlex.join(words)


def fingerprint(step: Step) -> str:
    """What decides whether a finished step can be reused: its command and its job."""
    text = json.dumps({"args": step.args, "job": step.job})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def finished(paper_dir: Path, step: Step) -> Optional[Record]:
    """The step's record if it finished (ok) with this very command; else None."""
    path = directory(paper_dir, step) / "step.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fingerprint") != fingerprint(step) or not data.get("ok"):
        return None
    if not all((path.parent / output).exists() for output in step.outputs):
        return None
    return Record(name=step.name, command=data["command"], exit_code=data["exit_code"],
                  seconds=data["seconds"], finished=data["finished"], reused=True, ok=True,
                  commit=data.get("commit", ""))


def check_root(steps: Sequence[Step], paper_dirs: Sequence[Path]) -> None:
    """Refuse before anything runs when a step to run needs root and we are not."""
    if os.geteuid() == 0:
        return
    for step, paper_dir in zip(steps, paper_dirs):
        if step.needs_root and finished(paper_dir, step) is None:
            raise TailcutError(f"step {step.name} ({step.title}) runs `tailcut run`, which "
                               f"needs root (namespaces, tc, XDP); run reproduce as root")


def run(step: Step, paper_dir: Path, label: str, clock: Clock, progress: Progress,
        commit: str = "") -> Record:
    """Reuse the step if it finished before, else run it with progress lines."""
    out = directory(paper_dir, step)
    previous = finished(paper_dir, step)
    if previous is not None:
        progress(f"{label} {step.title}: reused (finished {previous.finished}, took "
                 f"{_duration(previous.seconds)})")
        return previous
    clock.left_s -= step.estimate_s
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if step.job is not None:
        (out / "job.yaml").write_text(step.job)
    command = display(step, out, paper_dir)
    progress(f"{label} {step.title}: {command}  (about {_duration(step.estimate_s)}; "
             f"all: about {_duration(step.estimate_s + clock.left_s)} left)")
    started = time.monotonic()
    log_path = out / "log.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tailcut.cli", *argv(step, out)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env)
        try:
            next_beat = started + HEARTBEAT_S
            while proc.poll() is None:
                time.sleep(0.5)
                if time.monotonic() >= next_beat:
                    next_beat += HEARTBEAT_S
                    elapsed = time.monotonic() - started
                    this = step.estimate_s - elapsed
                    progress(f"  {step.name}: {_duration(elapsed)} in, {_left(this)} in "
                             f"this step, all: about "
                             f"{_duration(max(0.0, this) + clock.left_s)} left; "
                             f"{_last_line(log_path)}")
        except BaseException:   # ^C reaches the child too (same process group): let it clean up
            _wait_for(proc)
            raise
    seconds = time.monotonic() - started
    ok = proc.returncode in step.ok_exit_codes and all(
        (out / output).exists() for output in step.outputs)
    record = Record(name=step.name, command=command, exit_code=proc.returncode,
                    seconds=round(seconds, 1), finished=time.strftime("%Y-%m-%d %H:%M:%S"),
                    ok=ok, commit=commit)
    (out / "step.json").write_text(json.dumps(
        {**record.__dict__, "fingerprint": fingerprint(step), "estimate_s": step.estimate_s,
         "title": step.title}, indent=2) + "\n")
    if ok:
        progress(f"  {step.name}: done in {_duration(seconds)}")
    else:
        missing = [o for o in step.outputs if not (out / o).exists()]
        why = f"exit {proc.returncode}" + (f", no {', '.join(missing)}" if missing else "")
        progress(f"  {step.name}: FAILED ({why}) after {_duration(seconds)}; "
                 f"last lines of {log_path}:\n" + _tail(log_path, 8))
    return record


def _wait_for(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _last_line(path: Path) -> str:
    lines = _tail(path, 1).strip()
    return lines[-160:] if lines else "(no output yet)"


def _tail(path: Path, count: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join("    " + line for line in lines[-count:])


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _left(seconds: float) -> str:
    return f"about {_duration(seconds)} left" if seconds > 0 else "over its estimate"
