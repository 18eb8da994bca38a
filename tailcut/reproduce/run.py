"""Reproduce one paper or all four: run their steps, read our numbers, write the reports."""

from __future__ import annotations

import importlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tailcut import papers
from tailcut.reproduce import environment, report, steps
from tailcut.reproduce.measure import Files
from tailcut.reproduce.steps import Clock, Progress


@dataclass
class Outcome:
    paper: str
    report: Path
    failed_steps: list[str]


def module(name: str) -> ModuleType:
    """The paper's module: ``steps(quick)`` and ``measure(files, quick)``."""
    return importlib.import_module(f"tailcut.reproduce.{name}")


def reproduce(names: Sequence[str], results_dir: Path, quick: bool, fresh: bool,
              invocation: str, progress: Progress) -> list[Outcome]:
    loaded = {name: papers.load(name) for name in names}   # a bad data file stops here
    plans = {name: module(name).steps(quick) for name in names}
    dirs = {name: results_dir / name for name in names}
    if fresh:   # first: the root check then sees that every step will run
        for name in names:
            shutil.rmtree(dirs[name] / "steps", ignore_errors=True)
    steps.check_root([s for n in names for s in plans[n]],
                     [dirs[n] for n in names for _ in plans[n]])
    todo = [(n, s) for n in names for s in plans[n] if steps.finished(dirs[n], s) is None]
    clock = Clock(left_s=sum(s.estimate_s for _, s in todo))
    total = sum(len(plans[n]) for n in names)
    progress(f"reproduce {', '.join(names)}{' (--quick)' if quick else ''}: {total} steps, "
             f"{total - len(todo)} finished before; about {_minutes(clock.left_s)} to go; "
             f"results in {results_dir}")
    env = _environment(results_dir)
    outcomes = []
    index = 0
    for name in names:
        paper_dir = dirs[name]
        paper_dir.mkdir(parents=True, exist_ok=True)
        ran = []
        for step in plans[name]:
            index += 1
            ran.append((step, steps.run(step, paper_dir, f"[{index}/{total}] {name}:",
                                        clock, progress, str(env["git_commit"]))))
        measured = module(name).measure(Files(paper_dir), quick)
        shutil.copyfile(papers.path(name), paper_dir / "paper.yaml")
        path = report.write(loaded[name], measured, ran, env, paper_dir, invocation, quick)
        failed = [record.name for _, record in ran if not record.ok]
        outcomes.append(Outcome(name, path, failed))
        progress(f"{name}: report {path}" + (f" (failed steps: {', '.join(failed)})"
                                             if failed else ""))
    _index(results_dir, outcomes, loaded, invocation, time.monotonic() - clock.started)
    return outcomes


def _environment(results_dir: Path) -> dict[str, object]:
    env = environment.collect()
    env["doctor"] = environment.doctor()
    out = results_dir / "environment"
    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.txt").write_text(str(env["doctor"]))
    (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    return env


def _index(results_dir: Path, outcomes: Sequence[Outcome],
           loaded: dict[str, papers.Paper], invocation: str, seconds: float) -> None:
    lines = ["# tailcut reproduce", "", f"`{invocation}` took {_minutes(seconds)}.", ""]
    for outcome in outcomes:
        paper = loaded[outcome.paper]
        state = (f"failed steps: {', '.join(outcome.failed_steps)}" if outcome.failed_steps
                 else "every step finished")
        lines.append(f"- [{outcome.paper}]({outcome.report.relative_to(results_dir)}): "
                     f"{paper.title} ({paper.venue}); {state}")
    (results_dir / "index.md").write_text("\n".join(lines) + "\n")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"
