"""Training side of a tailcut job: the PS/worker roles (models and data: tailcut.ml).

The runtime launches ``python -m tailcut.training.role CONFIG.json`` once per pod;
``config.RoleConfig`` is the file format; the roles are ``ps`` (a shard, or the
replica), ``worker`` and ``aggregator``; ``inbox``, ``peers``, ``rpc`` are their plumbing.
"""
