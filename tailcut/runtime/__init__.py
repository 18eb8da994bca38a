"""Runtimes that turn a TrainingJob into a running job: `local` (namespaces on this host)."""
