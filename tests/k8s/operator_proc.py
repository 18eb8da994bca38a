"""Start and stop the kopf operator (operator/handlers.py) as a subprocess for tests."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
HANDLERS = REPO / "operator" / "handlers.py"


def start(kubeconfig: Path, log: Path, backend: str = "kubernetes",
          namespace: Optional[str] = None, extra_env: Optional[dict[str, str]] = None
          ) -> subprocess.Popen[bytes]:
    scope = ["--namespace", namespace] if namespace else ["--all-namespaces"]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TAILCUT_OPERATOR_BACKEND": backend,
           "TAILCUT_WORKER_IMAGE": "tailcut/worker:test",
           # a cluster whose chart names the worker image with PyTorch
           "TAILCUT_WORKER_TORCH_IMAGE": "tailcut/worker-torch:test", **(extra_env or {})}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--standalone", *scope, str(HANDLERS)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def start_as_deployed(kubeconfig: Path, log: Path, deployment: dict) -> subprocess.Popen[bytes]:
    """The operator as the chart's Deployment `deployment` (as installed) runs it: its
    kopf arguments (the handlers at their path here; no liveness endpoint, whose port
    a test must not hold) and its container's environment (no metrics port)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [str(HANDLERS) if a == "/app/operator/handlers.py" else a
            for a in container["args"] if not a.startswith("--liveness")]
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]},
           "KUBECONFIG": str(kubeconfig), "TAILCUT_METRICS_PORT": "0"}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "kopf", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(check, timeout_s: float = 60.0, what: str = "condition", log: Optional[Path] = None):
    """Poll `check()` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{tail}")


def get_json(cp, *args: str) -> dict:
    return json.loads(cp.kubectl(*args, "-o", "json").stdout)
