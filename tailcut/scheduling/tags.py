"""CadentFlow tags derived from a model's layers: priorities and deadlines per flow.

The paper's rules (section 4.1):
- Pull (forward-pass CadentFlow): all parameters are ready at the iteration start;
  layer k is consumed after the forward compute of layers 0..k-1, so its deadline is
  that compute time, and its priority is k (earlier layers first; 0 is highest).
- Push (backward-pass CadentFlow): layer k's gradient is ready after the backward
  compute of layers n-1..k (its release time); all pushes share one deadline, the end
  of the backward pass. Among them earlier layers go first (priority k) because the
  next forward pass needs them first (as P3 does).
"""

from __future__ import annotations

from collections.abc import Sequence


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
