"""Rate allocation of the three policies over the flows active at one instant.

Every function takes the flows' paths as an (F, K) array of link ids (padded with
the id of a dummy link of infinite capacity), the links' residual capacities in
bytes/s, and returns each flow's rate in bytes/s. Policies:

- `max_min`: TCP-like max-min fair share (progressive filling).
- `madd`: Varys' Minimum Allocation for Desired Duration, per coflow, coflows taken
  smallest-bottleneck first: every flow of a coflow gets remaining / Gamma, so all
  finish together at Gamma, the coflow's bottleneck time on what is left of the links.
- `strict`: flows grouped by a key (priority level or absolute deadline), lower key
  first; each group is max-min fair on what the groups before it left.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-12


def max_min(paths: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows with `paths` over links with `residual` capacity.
    `residual` is updated in place with what the flows leave."""
    flows = paths.shape[0]
    rates = np.zeros(flows)
    if flows == 0:
        return rates
    links = residual.shape[0]
    unfrozen = np.arange(flows)
    while unfrozen.size:
        sub = paths[unfrozen]
        counts = np.bincount(sub.ravel(), minlength=links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, residual / np.maximum(counts, 1), np.inf)
        level = share.min()
        if not np.isfinite(level):
            # Only the dummy link left: cannot happen for real paths.
            raise ValueError("a flow crosses no capacity-limited link")
        level = max(level, 0.0)
        bottleneck = share <= level * (1 + 1e-9) + _EPS
        hit = bottleneck[sub].any(axis=1)
        rates[unfrozen[hit]] = level
        np.subtract.at(residual, sub[hit].ravel(), level)
        np.maximum(residual, 0.0, out=residual)
        unfrozen = unfrozen[~hit]
    return rates


def madd(paths: np.ndarray, remaining: np.ndarray, coflow: np.ndarray,
         residual: np.ndarray) -> np.ndarray:
    """Varys' MADD rates, coflows in smallest-effective-bottleneck-first order."""
    rates = np.zeros(paths.shape[0])
    if not paths.shape[0]:
        return rates
    links = residual.shape[0]
    ids = np.unique(coflow)
    # Order by bottleneck on the full residual capacity (SEBF).
    gammas = []
    for cid in ids:
        members = coflow == cid
        load = np.bincount(paths[members].ravel(), weights=np.repeat(
            remaining[members], paths.shape[1]), minlength=links)
        with np.errstate(divide="ignore", invalid="ignore"):
            gammas.append(np.max(np.where(load > 0, load / residual, 0.0)))
    for _, cid in sorted(zip(gammas, ids)):
        members = np.flatnonzero(coflow == cid)
        load = np.bincount(paths[members].ravel(), weights=np.repeat(
            remaining[members], paths.shape[1]), minlength=links)
        with np.errstate(divide="ignore", invalid="ignore"):
            gamma = np.max(np.where(load > 0, load / np.maximum(residual, 0.0), 0.0))
        if not np.isfinite(gamma) or gamma <= 0:
            continue  # a link it needs is full: this coflow waits
        rate = remaining[members] / gamma
        rates[members] = rate
        np.subtract.at(residual, paths[members].ravel(), np.repeat(rate, paths.shape[1]))
        np.maximum(residual, 0.0, out=residual)
    return rates


def strict(paths: np.ndarray, key: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Strict priority by `key` (lower first), max-min fair within equal keys."""
    rates = np.zeros(paths.shape[0])
    if not paths.shape[0]:
        return rates
    order = np.argsort(key, kind="stable")
    sorted_keys = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], len(order)]
    finite = residual[:-1]  # the last link is the dummy with infinite capacity
    # A flow none of whose links has capacity left gets nothing: its group skips it,
    # and once every flow still waiting is so blocked, the loop ends.
    blocked = (residual[paths] <= _EPS).any(axis=1)
    for lo, hi in zip(starts, ends):
        if not (finite > _EPS).any():
            break
        group = order[lo:hi]
        group = group[~blocked[group]]
        if not group.size:
            continue
        rates[group] = max_min(paths[group], residual)
        rest = order[hi:]
        blocked[rest] = (residual[paths[rest]] <= _EPS).any(axis=1)
        if blocked[rest].all():
            break
    return rates
