"""Steps: a finished step is reused only with the same command; a failed one runs again."""

from pathlib import Path

from tailcut.reproduce import steps
from tailcut.reproduce.steps import Clock, Step


def _run(step: Step, paper_dir: Path, lines: list[str]) -> steps.Record:
    return steps.run(step, paper_dir, "[1/1] test:", Clock(left_s=step.estimate_s), lines.append)


def test_a_finished_step_is_reused_and_a_changed_one_runs_again(tmp_path):
    lines: list[str] = []
    step = Step("models", "list the models", ("models",), estimate_s=5)
    first = _run(step, tmp_path, lines)
    assert first.ok and not first.reused and first.exit_code == 0
    log = tmp_path / "steps" / "models" / "log.txt"
    assert "sparse" in log.read_text()   # the real command's output
    written = log.stat().st_mtime_ns

    again = _run(step, tmp_path, lines)
    assert again.reused and again.ok
    assert log.stat().st_mtime_ns == written
    assert "reused" in lines[-1]

    changed = Step("models", "list the models", ("models",), estimate_s=5,
                   job="apiVersion: x\n")   # other inputs: not the same step any more
    third = _run(changed, tmp_path, lines)
    assert not third.reused and (tmp_path / "steps" / "models" / "job.yaml").exists()


def test_a_failed_step_is_recorded_with_its_output_and_not_reused(tmp_path):
    lines: list[str] = []
    step = Step("bad", "a sweep of a model that does not exist",
                ("sweep", "--model", "no-such-model", "--results-dir", "{out}"), estimate_s=5)
    record = _run(step, tmp_path, lines)
    assert not record.ok and record.exit_code == 2
    assert "FAILED (exit 2)" in "\n".join(lines) and "no-such-model" in "\n".join(lines)
    assert steps.finished(tmp_path, step) is None
    assert not _run(step, tmp_path, lines).reused


def test_an_accepted_exit_code_without_the_steps_outputs_is_a_failure(tmp_path):
    # as a `tailcut run` that crashed with exit 1 (accepted: a missed accuracy target)
    lines: list[str] = []
    step = Step("crashed", "a command that leaves none of its files",
                ("sweep", "--model", "no-such-model", "--results-dir", "{out}"),
                estimate_s=5, ok_exit_codes=(0, 2), outputs=("table3.csv",))
    record = _run(step, tmp_path, lines)
    assert not record.ok and "FAILED (exit 2, no table3.csv)" in "\n".join(lines)
    assert steps.finished(tmp_path, step) is None


def test_the_command_shown_is_the_one_a_person_can_retype(tmp_path):
    step = Step("sweep", "s", ("sweep", "--results-dir", "{out}"), estimate_s=1)
    out = steps.directory(tmp_path, step)
    assert steps.display(step, out, tmp_path) == "tailcut sweep --results-dir steps/sweep"
    assert steps.argv(step, out) == ["sweep", "--results-dir", str(out)]
