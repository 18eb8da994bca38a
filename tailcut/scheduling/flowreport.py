"""A run's per-tensor flows: the roles' tag config from the spec, and the FCT summary.

`role_flows(job)` is the ``flows`` section of every role config (levels per tensor from
tailcut.scheduling.tags.resolve); `summarize(results_dir)` reads the roles'
flows-*.csv and gives what metrics.json records under "scheduling"::

    {"policy": "cadentflow", "iteration_s": 0.153, "iterations_measured": 120,
     "phases_s": {"last_pull_done": 0.21, "first_push_sent": 0.2, "last_push_done": 0.43},
     "fct_s": {"pull": {"fc1.weight": {"level": 0, "median": 0.021, "p95": ..., "n": 480}},
               "push": {...}}}

Iteration time is the median gap between the starts of successive pulls (the first
PARAMS of iteration k leaving a PS, to that of k+1): one whole pull-compute-push cycle.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tailcut.scheduling import madd, tags
from tailcut.spec.model import TrainingJob
from tailcut.training.shards import shard_range


def layer_names(model: str, seed: int) -> list[str]:
    """The tensors of the job's model, in forward order."""
    from tailcut.ml import models  # numpy models: only when a run needs them

    return [layer.name for layer in models.create(model, models.dataset(model, seed)).layers]


def coflow_pace(job: TrainingJob, num_params: int) -> dict[str, dict[str, float]]:
    """MADD rate (payload bytes/s) of every flow of the job's two coflows, by sender
    and receiver: one iteration's pulls (every PS shard's PARAMS to every worker) and
    its pushes (every worker's PUSH to every shard). Sizes are the shards' values (4
    bytes each), links and capacities those the testbed builds for the job."""
    from tailcut.net import topology

    topo = topology.plan(job)
    capacity = madd.capacities(topo)
    shards = job.spec.replicas.parameter_servers
    workers = [p.name for p in topo.pods if p.role == "worker"]
    pull, push = [], []
    for s in range(shards):
        lo, hi = shard_range(num_params, shards, s)
        for w in workers:
            pull.append(madd.Flow((f"ps-{s}", w), madd.path(topo, f"ps-{s}", w), 4 * (hi - lo)))
            push.append(madd.Flow((w, f"ps-{s}"), madd.path(topo, w, f"ps-{s}"), 4 * (hi - lo)))
    pace: dict[str, dict[str, float]] = {}
    for coflow in (pull, push):
        for key, rate in madd.rates(coflow, capacity).items():
            sender, receiver = cast(tuple[str, str], key)
            pace.setdefault(sender, {})[receiver] = round(rate, 1)
    return pace


def role_flows(job: TrainingJob) -> dict[str, Any]:
    """The roles' ``flows`` config: the policy and, for cadentflow, each tensor's level
    per direction (untagged tensors get the last level, the least urgent); for
    coflow, each flow's MADD rate (coflow_pace)."""
    scheduling = job.spec.scheduling
    if scheduling.policy == "coflow":
        from tailcut.ml import models

        model = models.create(job.spec.training.model_ref,
                              models.dataset(job.spec.training.model_ref,
                                             job.spec.training.seed))
        return {"policy": "coflow", "pace": coflow_pace(job, model.num_params)}
    if scheduling.policy != "cadentflow":
        return {"policy": scheduling.policy}
    names = layer_names(job.spec.training.model_ref, job.spec.training.seed)
    resolved = tags.resolve(scheduling, names)
    last = scheduling.priority_levels - 1
    out: dict[str, Any] = {"policy": "cadentflow"}
    for direction in ("pull", "push"):
        out[direction] = {name: (resolved[(name, direction)].priority
                                 if resolved[(name, direction)].priority is not None else last)
                          for name in names}
    return out


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _stats(values: list[float]) -> dict[str, Any]:
    """Median and p95 (s, to the µs) and how many: what the summary gives per series."""
    return {"median": round(statistics.median(values), 6),
            "p95": round(_p95(values), 6), "n": len(values)}


@dataclass
class _Flows:
    """What summarize gathers from the rows of a run's flows-*.csv."""
    # per direction ("pull", "push") and tensor: every row's completion time (s)
    fct: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {"pull": defaultdict(list), "push": defaultdict(list)})
    # per (direction, tensor): its level as the CSV gives it ("" when untagged)
    level: dict[tuple[str, str], str] = field(default_factory=dict)
    # per iteration: its first PARAMS sent (ns)
    pull_start: dict[int, int] = field(default_factory=dict)
    # per iteration: last PARAMS received, first PUSH sent, last PUSH received (ns)
    marks: dict[int, list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 2**63, 0]))
    # per (direction, iteration, sender -> receiver): first part sent, last received (ns)
    messages: dict[tuple[str, int, str], list[int]] = field(default_factory=dict)


def summarize(results_dir: Path, policy: str) -> dict[str, Any]:
    """Median iteration time and per-tensor FCTs of a finished run's flows-*.csv."""
    flows = _Flows()
    for path in sorted(results_dir.glob("flows-*.csv")):
        _read_flows(path, flows)
    gaps, phases = _iterations(flows)
    flow_fct, spread = _per_flow(flows.messages)
    level = flows.level
    return {
        "policy": policy,
        # medians over iterations, seconds from the iteration's first pull
        "phases_s": ({name: round(statistics.median(col), 6) for name, col in zip(
            ("last_pull_done", "first_push_sent", "last_push_done"), zip(*phases))}
            if phases else None),
        "iteration_s": round(statistics.median(gaps), 6) if gaps else None,
        "iterations_measured": len(gaps),
        "fct_s": {d: {name: {"level": int(level[(d, name)]) if level[(d, name)] else None,
                             **_stats(v)}
                      for name, v in by_layer.items()}
                  for d, by_layer in flows.fct.items()},
        "flow_fct_s": {d: {pair: _stats(v) for pair, v in sorted(by_pair.items())}
                       for d, by_pair in flow_fct.items()},
        "coflow_spread_s": {d: (_stats(v) if v else None) for d, v in spread.items()},
    }


def _read_flows(path: Path, flows: _Flows) -> None:
    """Add one role's flows-*.csv to `flows`."""
    with path.open(newline="") as f:
        # csv.reader and the columns by index: a DictReader's dict per row was
        # half of this loop's time (~14,000 rows for the quickstart)
        rows = csv.reader(f)
        col = {name: i for i, name in enumerate(next(rows, ()))}
        k_kind, k_layer, k_level = col["kind"], col["layer"], col["level"]
        k_it, k_sent, k_done = col["iteration"], col["sent_at_ns"], col["received_at_ns"]
        k_fct, k_from, k_to = col["completion_s"], col["sender"], col["receiver"]
        fct, level, messages = flows.fct, flows.level, flows.messages
        pull_start, marks = flows.pull_start, flows.marks
        # the row's updates stay inline, not in functions: this loop is the hot one
        for row in rows:
            direction = "pull" if row[k_kind] == "PARAMS" else "push"
            layer = row[k_layer]
            fct[direction][layer].append(float(row[k_fct]))
            level[(direction, layer)] = row[k_level]
            it, sent, done = int(row[k_it]), int(row[k_sent]), int(row[k_done])
            flow = (direction, it, f"{row[k_from]}->{row[k_to]}")
            span = messages.get(flow)
            if span is None:
                messages[flow] = [sent, done]
            else:
                if sent < span[0]:
                    span[0] = sent
                if done > span[1]:
                    span[1] = done
            mark = marks[it]
            if direction == "pull":
                if sent < pull_start.get(it, sent + 1):
                    pull_start[it] = sent
                if done > mark[0]:
                    mark[0] = done
            else:
                if sent < mark[1]:
                    mark[1] = sent
                if done > mark[2]:
                    mark[2] = done


def _iterations(flows: _Flows) -> tuple[list[float], list[list[float]]]:
    """Per measured iteration (one whose successor started too): its time, and its
    phase marks in seconds from its first pull (only those whose pushes ended)."""
    pull_start, marks = flows.pull_start, flows.marks
    steps = sorted(pull_start)
    gaps = [(pull_start[b] - pull_start[a]) / 1e9 for a, b in zip(steps, steps[1:])
            if b == a + 1]
    phases = [[(m - pull_start[a]) / 1e9 for m in marks[a]] for a, b in zip(steps, steps[1:])
              if b == a + 1 and marks[a][2]]
    return gaps, phases


def _per_flow(messages: dict[tuple[str, int, str], list[int]]
              ) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """Per flow (one PS -> worker PARAMS, or one worker -> PS PUSH): its completion
    times; per coflow (an iteration's pulls, or pushes): how far apart its flows
    ended, last minus first (MADD makes this ~0). Sender -1 is the PS."""
    flow_fct: dict[str, dict[str, list[float]]] = {"pull": defaultdict(list),
                                                    "push": defaultdict(list)}
    ends: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (direction, it, pair), (sent, done) in messages.items():
        flow_fct[direction][pair].append((done - sent) / 1e9)
        ends[(direction, it)].append(done)
    spread = {d: [(max(v) - min(v)) / 1e9 for (dd, _), v in ends.items()
                  if dd == d and len(v) > 1] for d in ("pull", "push")}
    return flow_fct, spread


def describe(summary: dict[str, Any]) -> str:
    """One line for the run's progress output."""
    pulls = ", ".join(f"{name} {s['median'] * 1e3:.1f}"
                      for name, s in summary["fct_s"]["pull"].items())
    it = summary["iteration_s"]
    spread = (summary.get("coflow_spread_s") or {}).get("pull")
    ends = (f"; an iteration's pulls ended within {spread['median'] * 1e3:.1f} ms of each "
            "other (median)" if spread else "")
    return (f"{summary['policy']}: iteration {it * 1e3:.1f} ms (median of "
            f"{summary['iterations_measured']}); pull FCT ms by tensor: {pulls}{ends}"
            if it is not None else f"{summary['policy']}: no complete iteration measured")
