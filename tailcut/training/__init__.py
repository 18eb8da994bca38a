"""Training side of a tailcut job: generated data, numpy models and the PS/worker roles.

The runtime launches ``python -m tailcut.training.role CONFIG.json`` once per pod;
``config.RoleConfig`` is the file format; the roles are ``ps`` (a shard, or the
replica), ``worker`` and ``aggregator``; ``inbox``, ``peers``, ``rpc`` are their plumbing.
"""
