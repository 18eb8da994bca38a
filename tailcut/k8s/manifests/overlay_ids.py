"""Each TrainingJob's overlay id: the VXLAN network identifier (VNI) that joins its
spines on several nodes (tailcut.net.overlay), unique among the cluster's jobs.

The kernel hands a VXLAN packet to the device of its VNI, so two jobs with one VNI
could take each other's cross-node packets. A hash of the job's name was not unique
(24 bits: a name that collides with another job's is found offline in seconds), so the
operator allocates the id: a random one that no TrainingJob of the cluster holds in
its status.overlayId, chosen and recorded under one lock, with the placement, before
anything of the job is created. The node agents read it there (the status subresource,
which a namespace's users are not granted) and take nothing else.

Pure: the operator lists the jobs and writes the status.
"""

import secrets
from typing import Any, Callable, Iterable, Mapping, Optional

FIRST = 1               # VNI 0 is valid, but 0 reads as "none" too often
LAST = 2 ** 24 - 1      # 24 bits
STATUS_FIELD = "overlayId"


def taken(jobs: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """The ids the TrainingJobs `jobs` (as the API returns them) hold: id -> ns/name."""
    held = {}
    for job in jobs:
        found = (job.get("status") or {}).get(STATUS_FIELD)
        if isinstance(found, int):
            meta = job.get("metadata") or {}
            held[found] = f"{meta.get('namespace')}/{meta.get('name')}"
    return held


def choose(held: Mapping[int, str],
           pick: Callable[[int], int] = secrets.randbelow) -> int:
    """A random id in FIRST..LAST that is not in `held`. Random rather than the lowest
    free one: a deleted job's id is not handed on at once while its links may still
    be going on some node."""
    if len(held) >= LAST - FIRST + 1:
        raise RuntimeError("every overlay id is taken: delete finished TrainingJobs")
    while True:
        found = FIRST + pick(LAST - FIRST + 1)
        if found not in held:
            return found


def from_status(status: Mapping[str, Any]) -> Optional[int]:
    """The job's status.overlayId, or None if the operator has not recorded one;
    ValueError naming the field if it is not an id."""
    found = status.get(STATUS_FIELD)
    if found is None:
        return None
    if isinstance(found, bool) or not isinstance(found, int) or not FIRST <= found <= LAST:
        raise ValueError(f"status.{STATUS_FIELD}={found!r}: not a VXLAN id "
                         f"({FIRST} to {LAST})")
    return found
