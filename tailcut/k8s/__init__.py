"""Kubernetes: the TrainingJob CRD, the manifests the operator creates, and its status."""
