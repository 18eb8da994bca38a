"""Central finite-difference gradient check shared by the model tests."""

from __future__ import annotations

from typing import Any

import numpy as np


def max_gradient_error(model: Any, params: np.ndarray, x: np.ndarray, y: np.ndarray,
                       eps: float = 1e-6) -> tuple[float, float]:
    """(largest |analytic - numeric| over all coordinates, largest |analytic|), in float64."""
    params = params.astype(np.float64)
    _, grad = model.loss_and_grad(params, x, y)
    assert grad.dtype == np.float64 and grad.shape == params.shape
    worst = 0.0
    for i in range(params.size):
        step = np.zeros_like(params)
        step[i] = eps
        up, _ = model.loss_and_grad(params + step, x, y)
        down, _ = model.loss_and_grad(params - step, x, y)
        worst = max(worst, abs(grad[i] - (up - down) / (2 * eps)))
    return worst, float(np.abs(grad).max())
