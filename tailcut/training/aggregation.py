"""The aggregation rule: how the PS turns the gradient values that arrived into one step.

Over a lossy transport each worker's gradient reaches the PS only in part. The PS
sums, per coordinate, the values that arrived (``total``) and counts how many
workers' values that sum holds (``counts``); ``combine`` turns the two into the
direction of the SGD step. ``spec.training.aggregation`` chooses the rule; the PS's
bsp barrier, its step on in-network sums and the emulated mode all call ``combine``.

Why two rules (the derivation). Take one coordinate, N workers with values g_i, and
D_i = 1 when worker i's value arrived, with P(D_i = 1) = q independently of the
values and of each other (random loss, the model of "Distributed Training under
Packet Loss", arXiv 2507.07114). The lossless job steps on the all-worker mean
g = (1/N) sum g_i. Let k = sum D_i.

- ``mean`` (the default, tailcut's rule before this option): m = sum D_i g_i / k, and
  0 when k = 0 (nobody's value arrived: the parameter stays). Given k >= 1 the values
  that arrived are a uniformly random k of the N, so E[m | k] = g; but E[m] =
  P(k >= 1) g = (1 - (1 - q)^N) g. It shrinks the step by the chance that every
  worker lost the coordinate: 1e-4 at 10% loss with 4 workers, 6% at 50% loss,
  25% with 2 workers at 50%. It is the estimator below with q estimated per
  coordinate as k / N.
- ``unbiased`` (inverse-probability, Horvitz-Thompson): u = sum D_i g_i / (N q),
  whose mean is exactly g for the true q, the lost coordinates' zeros included.
  The PS does not know q; it estimates it as the share of this iteration's
  (worker, coordinate) values that arrived, pooled over its whole range. With M
  independently lost packets per message, E[D_i / q_hat] = 1 - (1 - q)^(N M)
  (because E[1 / (1 + Binomial(n, q))] = (1 - (1 - q)^(n+1)) / ((n+1) q)), so u is
  unbiased to within (1 - q)^(N M): below 10^-700 at 10% loss for the MLP's 180
  packets and 4 workers.

The price of ``unbiased`` is variance: where all workers agree (g_i = g), m = g
exactly, while u = g k / (N q_hat) scatters by sqrt((1 - q) / (N q)) of g, 17% at 10%
loss with 4 workers. Estimating q per message (each worker's delivered share) would
also stay unbiased when workers lose at different rates, where both rules here
are biased (``mean`` leans to the workers that lose less); but that weight must be
applied before summing, and a ToR's in-network sum has already mixed the workers.
Only the paper's abstract was reachable when this was written, so the estimator
is derived above rather than taken from its text.
"""

from __future__ import annotations

import numpy as np

RULES = ("mean", "unbiased")


def check(rule: str) -> None:
    """ValueError naming ``rule`` and the known rules unless it is one of them."""
    if rule not in RULES:
        raise ValueError(f"aggregation={rule!r}: must be one of {', '.join(RULES)}")


def combine(total: np.ndarray, counts: np.ndarray,
            rule: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """The step direction (float32) and which coordinates any worker delivered.

    ``total`` sums the values that arrived, ``counts`` how many workers each sum
    holds (a push that sums a group of workers counts as that many), so without
    loss every count is the number of workers N. A coordinate nobody delivered
    gets 0 under either rule, so the SGD step leaves that parameter as it was.
    Sums may be float64 (in-network): the division is done in their precision."""
    check(rule)
    delivered = counts > 0
    step = np.zeros(total.size, dtype=np.float32)
    if rule == "mean":
        np.divide(total, counts, out=step, where=delivered)
        return step, delivered
    # N q_hat, with q_hat = arrived / (N size) the share of (worker, coordinate)
    # values that arrived: exactly N without loss, so both rules then agree bit for bit.
    workers_delivered = float(counts.sum(dtype=np.float64)) / max(total.size, 1)
    if workers_delivered > 0:
        np.divide(total, workers_delivered, out=step, where=delivered)
    return step, delivered
