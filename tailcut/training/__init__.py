"""Training side of a tailcut job: generated data, numpy models and the PS/worker roles.

The runtime launches ``python -m tailcut.training.role CONFIG.json`` once per pod;
``config.RoleConfig`` is the file format, ``ps`` and ``worker`` are the two roles.
"""
