"""What each `training.syncMode` is, as traits: the spec, the plan, the executors and the
roles read these, not the mode's name (as they read a transport's in transport_kinds).

    mode = sync_modes.get(job.spec.training.sync_mode)
    if not mode.has_ps: ...   # the workers all-reduce among themselves: no PS pod

A new mode is a row of BUILTIN and its name in model.Training.sync_mode's Literal (the
CRD's enum; a test holds the two to the same names), then the roles that run it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncMode:
    """One way the workers' updates become the model."""

    name: str
    description: str
    has_ps: bool = True              # parameter servers hold the model (else the workers
    #                                  all-reduce it: no PS, replica or aggregator pods)
    combines_iteration: bool = False  # the PS waits for one iteration's pushes and combines
    #                                   them (training.aggregation, aggregator pods)
    takes_staleness: bool = False    # training.staleness bounds how far a worker runs ahead
    torch_only: bool = False         # its roles train PyTorch models only


BUILTIN: tuple[SyncMode, ...] = (
    SyncMode("bsp", "barrier every iteration", combines_iteration=True),
    SyncMode("async", "apply each push at once"),
    SyncMode("ssp", "async within a staleness bound", takes_staleness=True),
    SyncMode("allreduce", "no PS, the workers all-reduce: PyTorch DDP with Gloo over tcp, "
                          "tailcut's transpose all-reduce over the datagram transports",
             has_ps=False, torch_only=True),
)
NAMES: tuple[str, ...] = tuple(m.name for m in BUILTIN)
_BY_NAME = {m.name: m for m in BUILTIN}


def get(name: str) -> SyncMode:
    """The mode called `name`; ValueError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"syncMode {name!r}: one of {', '.join(NAMES)}") from None


def names_with(trait: str) -> str:
    """The modes that have `trait`, for a message: "ssp", or "bsp or async"."""
    return " or ".join(m.name for m in BUILTIN if getattr(m, trait))
