"""The machine learning a tailcut job trains, apart from how it is trained: numpy
models with their gradients (``mlp``, ``deep_mlp``, ``cnn``, ``rnn``, ``mf``,
``sparse``; ``models`` is the registry every role, the spec and the sweep use; the
``layerwise`` stages a worker runs one layer at a time) and the seeded synthetic data
sets they learn from (``data`` and ``images``, ``ratings``, ``sequences``,
``clicks``). Nothing here knows about roles, transports or networks
(tailcut.training has the PS/worker roles)."""
