"""CadentFlow tags derived from a model's layers: priorities and deadlines per flow.

The paper's rules (section 4.1):
- Pull (forward-pass CadentFlow): all parameters are ready at the iteration start;
  layer k is consumed after the forward compute of layers 0..k-1, so its deadline is
  that compute time, and its priority is k (earlier layers first; 0 is highest).
- Push (backward-pass CadentFlow): layer k's gradient is ready after the backward
  compute of layers n-1..k (its release time); all pushes share one deadline, the end
  of the backward pass. Among them earlier layers go first (priority k) because the
  next forward pass needs them first (as P3 does).

`resolve` turns a job's `spec.scheduling` into the tags of each (tensor, direction)
flow: derived from the model, then overridden by hand-written tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from tailcut.errors import SpecError

if TYPE_CHECKING:
    from tailcut.spec.model import Scheduling


def forward_priority(layer: int) -> int:
    """Priority of a pull of `layer` (0 is most urgent)."""
    return layer


def backward_priority(layer: int, layers: int) -> int:
    """Priority of a push of `layer`'s gradient: earlier layers first, as in pulls."""
    del layers  # kept in the signature: a reverse-order variant needs it
    return layer


def forward_deadlines_s(forward_s: Sequence[float]) -> list[float]:
    """Deadline of each layer's pull, relative to the iteration start: the forward
    compute time before that layer is read."""
    deadlines, clock = [], 0.0
    for seconds in forward_s:
        deadlines.append(clock)
        clock += seconds
    return deadlines


def backward_release_s(backward_s: Sequence[float]) -> list[float]:
    """When each layer's gradient is ready, relative to the end of the forward pass."""
    release = [0.0] * len(backward_s)
    clock = 0.0
    for i in range(len(backward_s) - 1, -1, -1):
        clock += backward_s[i]
        release[i] = clock
    return release


@dataclass(frozen=True)
class Tag:
    """The CadentFlow tags of one flow (None: not tagged with that metric)."""

    priority: Optional[int] = None
    deadline_s: Optional[float] = None
    weight: Optional[float] = None


def level_of(layer: int, layers: int, levels: int) -> int:
    """Priority level of `layer` when `layers` tensors share `levels` classes: the
    model's order (forward_priority) cut into equal buckets."""
    return min(levels - 1, forward_priority(layer) * levels // layers)


def resolve(scheduling: "Scheduling", layer_names: Sequence[str],
            forward_s: Optional[Sequence[float]] = None) -> dict[tuple[str, str], Tag]:
    """Tags of every (layer, direction) flow of a job: derived from the model when
    `scheduling.derive_tags` (priorities by layer order; pull deadlines from
    `forward_s`, the measured forward time per layer, when given), then overridden by
    the hand-written `scheduling.flows` in order. Unknown layer names are refused
    naming the tag."""
    levels = scheduling.priority_levels
    n = len(layer_names)
    derived_deadline = forward_deadlines_s(forward_s) if forward_s is not None else None
    tags: dict[tuple[str, str], Tag] = {}
    for k, name in enumerate(layer_names):
        for direction in ("pull", "push"):
            if not scheduling.derive_tags:
                tags[(name, direction)] = Tag()
                continue
            deadline = (derived_deadline[k] if derived_deadline is not None
                        and direction == "pull" else None)
            tags[(name, direction)] = Tag(level_of(k, n, levels), deadline)
    for i, hand in enumerate(scheduling.flows):
        if hand.layer != "*" and hand.layer not in layer_names:
            raise SpecError(f"spec.scheduling.flows[{i}].layer={hand.layer!r}: the model has "
                            f"no such tensor; its tensors are {', '.join(layer_names)}")
        for (name, direction), old in list(tags.items()):
            if hand.layer in ("*", name) and hand.direction in ("both", direction):
                tags[(name, direction)] = Tag(
                    hand.priority if hand.priority is not None else old.priority,
                    hand.deadline_ms / 1000 if hand.deadline_ms is not None else old.deadline_s,
                    hand.weight if hand.weight is not None else old.weight)
    return tags
