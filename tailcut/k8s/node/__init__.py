"""A real single-node Kubernetes cluster on this host (`tailcut cluster up`): see cluster.py."""
