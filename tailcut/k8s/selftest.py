"""`helm test`'s check: the TrainingJob CRD is served and the API server validates a
TrainingJob against its schema (run inside the cluster by helm/tailcut/templates/tests/,
as the chart's `tailcut-test` service account, whose only right is creating
TrainingJobs in the release's namespace).

Two server-side dry-run creates in the pod's own namespace (nothing is stored, so the
operator sees nothing): a valid job must be accepted and one with `replicas.workers: 0`
refused naming the field."""

import sys
from pathlib import Path
from typing import Any

from tailcut.k8s.manifests import crd

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PREFIX = "tailcut-selftest-"


def _job(workers: int) -> dict[str, Any]:
    return {"apiVersion": f"{crd.GROUP}/{crd.VERSION}", "kind": "TrainingJob",
            "metadata": {"generateName": PREFIX},   # never meets a job of the namespace
            "spec": {"replicas": {"workers": workers}}}


def check(api: Any, namespace: str) -> list[str]:
    """What is wrong (empty: nothing), using `api` (a CustomObjectsApi)."""
    import kubernetes

    def dry_run(workers: int) -> Any:
        return api.create_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace,
                                                   crd.PLURAL, _job(workers), dry_run="All")
    problems = []
    try:
        dry_run(1)
    except kubernetes.client.ApiException as err:
        problems.append(f"a valid {crd.CRD_NAME} was not accepted in {namespace}: "
                        f"{err.status} {err.reason} {err.body}")
    try:
        dry_run(0)
        problems.append(f"{crd.CRD_NAME} with spec.replicas.workers=0 was accepted: "
                        "the CRD's schema is not applied")
    except kubernetes.client.ApiException as err:
        if err.status != 422 or "spec.replicas.workers" not in str(err.body):
            problems.append(f"{crd.CRD_NAME} with spec.replicas.workers=0: expected 422 "
                            f"naming the field, got {err.status} {err.reason} {err.body}")
    return problems


def main() -> int:
    import kubernetes
    kubernetes.config.load_incluster_config()
    namespace = NAMESPACE_FILE.read_text().strip()
    problems = check(kubernetes.client.CustomObjectsApi(), namespace)
    for problem in problems:
        print(f"selftest: {problem}", file=sys.stderr)
    if not problems:
        print(f"selftest: {crd.CRD_NAME} is served and validates (dry runs in {namespace})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
