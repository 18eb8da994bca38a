"""Work the ToR does for a job in BPF (spec.network.inNetwork), set up the same way by
both executors: ``hotstore`` loads the hot-parameter store and serves a rack's ports
(tailcut run: all at once; the node agent: the uplink with the fabric, each pod's port
as it is wired)."""
