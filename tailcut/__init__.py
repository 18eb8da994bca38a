"""tailcut: a testbed for ML-aware network transport."""
