"""Every registered model trains to its target through the real PS and worker roles over TCP.

One short real job per model: a PS and 4 workers as processes on 127.0.0.1, with
the registry's learning rate, batch size and target. The same job emulated in
one process (``emulate.train`` at loss rate 0, run with one BLAS thread as the roles
are) must take exactly the same epochs and reach exactly the same accuracy: the
emulation is the PS's and workers' math, not an approximation of it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tailcut.ml import models
from tailcut.training.config import RoleConfig

ROLE = [sys.executable, "-m", "tailcut.training.role"]
WORKERS = 4
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
EMULATE = """
import json, sys
from tailcut.training import emulate
run = emulate.train(sys.argv[1], emulate.LossModel(0.0), num_workers=int(sys.argv[2]))
print(json.dumps({"epochs": run.epochs, "final_accuracy": round(run.final_accuracy, 6),
                  "converged": run.converged}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(tmp_path: Path, name: str) -> dict[str, Any]:
    """Run a real PS + 4 workers job; return the PS's "done" event."""
    entry = models.info(name)
    port = _free_port()
    procs = []
    for role, index in [("ps", 0)] + [("worker", i) for i in range(WORKERS)]:
        cfg = RoleConfig(job=f"md-loopback-{name}", role=role, index=index,
                         ps_host="127.0.0.1", ps_port=port, num_workers=WORKERS,
                         results_dir=str(tmp_path / "results"), model=name,
                         batch_size=entry.batch_size, learning_rate=entry.learning_rate,
                         max_epochs=entry.max_epochs, target_accuracy=entry.target_accuracy,
                         timeout_s=150)
        path = tmp_path / f"{role}-{index}.json"
        cfg.to_json(path)
        procs.append(subprocess.Popen([*ROLE, str(path)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outputs = [proc.communicate(timeout=200) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    codes = [proc.returncode for proc in procs]
    assert codes == [0] * len(procs), "\n".join(err for _, err in outputs)
    events = [json.loads(line) for line in outputs[0][0].splitlines()]
    assert events[0]["event"] == "start" and events[-1]["event"] == "done"
    return dict(events[-1])


@pytest.mark.parametrize("name", models.names())
def test_model_converges_over_loopback_exactly_as_its_emulation_does(
    tmp_path: Path, name: str
) -> None:
    done = _run_job(tmp_path, name)
    target = models.info(name).target_accuracy
    assert done["converged"] is True and done["stop_reason"] == "target_accuracy"
    assert done["final_accuracy"] >= target and done["epochs"] >= 2  # not trivially fast
    assert done["jct_s"] < 60

    emulated = subprocess.run([sys.executable, "-c", EMULATE, name, str(WORKERS)],
                              capture_output=True, text=True, env=ONE_THREAD, check=True)
    same = json.loads(emulated.stdout)
    assert same == {"epochs": done["epochs"], "final_accuracy": done["final_accuracy"],
                    "converged": True}
