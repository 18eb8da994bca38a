"""`helm test`'s check: the TrainingJob CRD is served and readable with the operator's
service account (run inside the cluster by helm/tailcut/templates/tests/)."""

import sys
from typing import Any

from tailcut.k8s.manifests import crd


def main() -> int:
    import kubernetes
    kubernetes.config.load_incluster_config()
    api = kubernetes.client.CustomObjectsApi()
    try:
        jobs: dict[str, Any] = api.list_cluster_custom_object(
            crd.GROUP, crd.VERSION, crd.PLURAL, limit=1)
    except kubernetes.client.ApiException as err:
        print(f"selftest: listing {crd.CRD_NAME} failed: {err.status} {err.reason}",
              file=sys.stderr)
        return 1
    print(f"selftest: {crd.CRD_NAME} is served ({len(jobs.get('items', []))} listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
