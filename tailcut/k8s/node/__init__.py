"""The local cluster tooling: a real Kubernetes cluster of one or more nodes on this host
(`tailcut cluster up`, see cluster.py), the bare etcd + kube-apiserver on loopback of
the tests and benchmarks (devcluster), the Kubernetes binaries they run (tools) and
tailcut's images built without Docker (images). Nothing here is part of what runs in a
cluster: the operator's manifests are tailcut.k8s.manifests, the node agent
tailcut.k8s.agent."""
