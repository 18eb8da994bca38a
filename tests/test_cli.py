"""The tailcut command line: validate, clean, and the README's promises."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tailcut import cli

ROOT = Path(__file__).resolve().parents[1]


def test_validate_accepts_the_quickstart(capsys):
    assert cli.main(["validate", "examples/quickstart.yaml"]) == 0
    assert "ok (local): job quickstart, 1 PS + 4 workers in 2 rack(s)" in capsys.readouterr().out


def test_validate_rejects_a_bad_file_with_the_field_and_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: TrainingJob\nmetadata: {name: x}\n"
                   "spec: {network: {accessLink: {bandwidth: 10Gbps}}}\n")
    assert cli.main(["validate", str(bad)]) == 2
    assert "spec.network.accessLink.bandwidth='10Gbps'" in capsys.readouterr().err


def test_every_example_validates():
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    assert cli.main(["validate", *map(str, examples)]) == 0


def test_ci_runs_the_test_command_the_readme_gives():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```(?:sh|bash)?\n(.*?)```", readme, re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_the_command_is_reachable_as_a_module():
    out = subprocess.run([sys.executable, "-m", "tailcut.cli", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "validate" in out.stdout


def test_models_lists_every_registered_model_with_its_size_and_target(capsys):
    from tailcut.ml import models
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line.split() for line in out[1:]}
    assert sorted(listed) == models.names()
    params, nbytes, target = listed["mlp"][1:4]
    assert (int(params), int(nbytes), float(target)) == (64714, 4 * 64714, 0.9)


def test_sweep_refuses_an_unknown_model_and_bad_settings_naming_them(capsys):
    assert cli.main(["sweep", "--model", "mlp,resnet"]) == 2
    assert "--model 'resnet': unknown; known: cnn, deep-mlp, even-mlp, mf, mlp, rnn, sparse, all" in (
        capsys.readouterr().err)
    assert cli.main(["sweep", "--model", "mf", "--runs", "0"]) == 2
    assert "--runs=0: must be >= 1" in capsys.readouterr().err
    assert cli.main(["sweep", "--model", "mf", "--bandwidth", "10Gbps"]) == 2
    assert "ambiguous" in capsys.readouterr().err


def test_sweep_writes_the_table_the_points_and_the_plot(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--model", "mf", "--max-loss-rate", "0.1", "--runs", "1", "--jobs", "1",
                     "--granularity", "coordinate", "--direction", "push",
                     "--results-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mf loss_rate=0.10:" in printed and "paper x1" in printed
    assert {p.name for p in out.iterdir()} == {"settings.json", "sweep.csv", "table3.csv",
                                               "fig2.png"}
    import csv
    with open(out / "table3.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["model"], row["granularity"], row["direction"]) == ("mf", "coordinate", "push")


def test_validate_refuses_what_tailcut_run_cannot_honour_naming_file_and_fields(tmp_path, capsys):
    job = tmp_path / "coflow-udp.yaml"
    job.write_text((ROOT / "examples" / "coflow.yaml").read_text()
                   .replace("type: tcp", "type: udp"))
    assert cli.main(["validate", str(job)]) != 0
    err = capsys.readouterr().err
    assert f"{job}: spec.scheduling.policy='coflow' with spec.transport.type='udp'" in err


def test_validate_warns_of_what_runs_but_is_most_likely_not_meant(tmp_path, capsys):
    job = tmp_path / "drop-all.yaml"
    job.write_text((ROOT / "examples" / "quickstart.yaml").read_text()
                   .replace("bandwidth: 1Gbit\n    uplink:", "bandwidth: 1Gbit\n      loss: 1\n"
                                                        "    uplink:"))
    assert cli.main(["validate", str(job)]) == 0
    out = capsys.readouterr().out
    assert "warning: spec.network.accessLink.loss=1: every packet is dropped" in out


def test_validate_for_kubernetes_gives_the_operators_verdict(tmp_path, capsys):
    """Nothing is refused only on Kubernetes any more: the bounded-loss example is ok
    for both executors, and what `tailcut run` refuses is refused for both, in the
    same words."""
    example = str(ROOT / "examples" / "bounded-loss.yaml")
    assert cli.main(["validate", "--executor", "kubernetes", example]) == 0
    out = capsys.readouterr().out
    assert "ok (kubernetes)" in out and "would refuse" not in out
    bad = tmp_path / "cf-appdrop.yaml"
    bad.write_text((ROOT / "examples" / "cadentflow.yaml").read_text()
                   .replace("transport:\n    type: tcp", "transport: {type: app-drop, p: 0.9}"))
    errors = []
    for executor in ("local", "kubernetes"):
        assert cli.main(["validate", "--executor", executor, str(bad)]) == 2
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1]
    assert "spec.scheduling.policy='cadentflow' with spec.transport.type='app-drop'" in errors[0]


def _commands(parser):
    import argparse
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_lean_parser_has_exactly_this_files_commands_and_the_full_one_all():
    # `tailcut run` builds the lean parser: the other commands' modules are slow to import.
    lean, full = _commands(cli._parser(lean=True)), _commands(cli._parser())
    assert lean == set(cli.CORE_COMMANDS)
    assert lean < full and {"cluster", "simulate", "reproduce"} <= full - lean


def test_a_command_of_this_file_does_not_import_the_kubernetes_commands():
    code = ("import sys; from tailcut import cli; cli.main(['validate', "
            "'examples/quickstart.yaml']); print('tailcut.k8s.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.stdout.strip().endswith("False"), out.stdout + out.stderr


def test_help_and_the_readme_name_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    shown = capsys.readouterr().out
    parser = cli._parser()
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    readme = (ROOT / "README.md").read_text()
    for name in commands:
        assert f"\n    {name} " in shown or f"\n    {name}\n" in shown, name
        assert f"`tailcut {name}" in readme, f"README's command table lacks {name}"
