"""Kubernetes, one concern per subpackage: manifests (the CRD and what the operator
builds and reads back), agent (the privileged node agent), node (the local cluster:
`tailcut cluster up`, the tests' API server, the images). At this level only what
several of them or the CLI share: the `tailcut cluster/images/collect` commands (cli),
a job's results from its pods (podresults, collect), the operator's and the agent's
/metrics (metrics) and `helm test`'s check (selftest)."""
