"""The tailcut command line: validate, clean, and the README's promises."""

import re
import subprocess
import sys
from pathlib import Path

from tailcut import cli

ROOT = Path(__file__).resolve().parents[1]


def test_validate_accepts_the_quickstart(capsys):
    assert cli.main(["validate", "examples/quickstart.yaml"]) == 0
    assert "ok: job quickstart, 1 PS + 4 workers in 2 rack(s)" in capsys.readouterr().out


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
