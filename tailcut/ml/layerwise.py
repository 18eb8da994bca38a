"""Layer-wise forward and backward passes: compute a stage as soon as its tensors are in.

A model that can (``supports``) splits its forward pass into stages, each reading one
contiguous range of the flat vector (a dense layer's weight and bias), and offers::

    stages: tuple[tuple[int, int], ...]        [lo, hi) each stage reads, forward order
    forward_stage(k, params, h) -> (out, cache)
    loss_head(out, y) -> (loss, d_out)
    backward_stage(k, params, cache, d_out, grad) -> d_in     writes grad[lo:hi] of stage k

``loss_and_grad`` chains them with two hooks: ``ready(k)`` blocks until stage k's
parameters have arrived (a worker waiting on per-tensor PARAMS parts), and
``done(k, grad)`` runs once stage k's range of ``grad`` is written (the worker pushes
it while the rest of the backward pass goes on). The numbers are those of the model's own
``loss_and_grad``: the same operations in the same order
(tests/ml/test_layerwise.py checks that they are equal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

STAGE_API = ("stages", "forward_stage", "loss_head", "backward_stage")


def supports(model: Any) -> bool:
    """Whether ``model`` can compute stage by stage (otherwise: the whole-model path)."""
    return all(hasattr(model, name) for name in STAGE_API)


def stage_of(model: Any, index: int) -> int:
    """The stage whose range holds flat index ``index``."""
    for k, (lo, hi) in enumerate(model.stages):
        if lo <= index < hi:
            return k
    raise ValueError(f"index {index} is in no stage of {model.name}")


def loss_and_grad(model: Any, params: np.ndarray, x: np.ndarray, y: np.ndarray,
                  ready: Callable[[int], None] = lambda k: None,
                  done: Callable[[int, np.ndarray], None] = lambda k, grad: None,
                  ) -> tuple[float, np.ndarray]:
    """Mean loss and flat gradient, computed stage by stage (see the module docstring)."""
    if params.shape != (model.num_params,):
        raise ValueError(f"params has shape {params.shape}, expected ({model.num_params},)")
    h = x
    caches = []
    for k in range(len(model.stages)):
        ready(k)
        h, cache = model.forward_stage(k, params, h)
        caches.append(cache)
    loss, delta = model.loss_head(h, y)
    grad = np.empty_like(params)
    for k in range(len(model.stages) - 1, -1, -1):
        delta = model.backward_stage(k, params, caches[k], delta, grad)
        done(k, grad)
    return loss, grad
