"""RoleConfig: everything one PS or worker process needs, as a JSON file the runtime writes.

The runtime fills one RoleConfig per pod from the validated TrainingJob and runs
``python -m tailcut.training.role CONFIG.json`` in it. The file is a flat JSON
object with exactly the fields below; unknown or missing fields are an error, so
a runtime and a role from different versions fail loudly instead of guessing::

    {"job": "demo", "role": "worker", "index": 2, "ps_host": "10.0.0.1",
     "ps_port": 7000, "num_workers": 4, "results_dir": "/tmp/demo", "model": "mlp",
     "batch_size": 32, "learning_rate": 0.3, "max_epochs": 20,
     "max_iterations": null, "target_accuracy": 0.9, "seed": 0, "sync_mode": "bsp",
     "transport": {"type": "tcp"}, "timeout_s": 180.0}

Fields added for sharding and the MLfabric roles (all optional; the defaults give
the plain 1-PS BSP job above):

- ``shard_endpoints``: ``"host:port"`` of every PS shard, shard 0 first; null means
  one shard at ``ps_host:ps_port``. A PS's ``index`` is its shard.
- ``replica_endpoint``: where the PS replica listens (one shard only), or null.
- ``aggregators``: ``[{"endpoint": "host:port", "workers": [0, 1]}, ...]``; a worker
  listed there pushes to that aggregator instead of to the shards.
- ``sync_mode`` ``bsp``, ``async`` or ``ssp`` with ``staleness`` (iterations a worker
  may run ahead of the slowest), ``ordering`` ``fifo`` or ``stf`` (shortest transfer
  first) for the updates a PS has waiting, ``window_us`` for concurrent connections.
- ``sync_mode`` ``allreduce``: no PS. Over tcp the workers run PyTorch DDP with Gloo
  (tailcut.training.allreduce), meeting at ``ps_host:ps_port``, which is then
  worker-0's address and its rendezvous port. Over udp or bounded-loss they run the
  transpose all-reduce (tailcut.training.transpose): ``shard_endpoints`` then lists
  every rank's own endpoint, rank i owning shard i, and ``rank_racks`` each rank's
  rack (training.relay: one rank per rack relays). ``model`` is a torch model:
  ``torch-mlp``, ``torch-cnn`` or ``torch:<package.module:factory>``.
- ``aggregation``: how a bsp PS combines the gradient values that arrived, ``mean``
  (over the workers that delivered each coordinate) or ``unbiased`` (inverse-probability
  weighting; tailcut.training.aggregation).
- ``flows``: the CadentFlow section, ``{"policy": "fair"}`` or ``{"policy": "cadentflow",
  "pull": {tensor: level}, "push": {tensor: level}}`` (tailcut.training.flows); null
  means neither cut nor log per tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailcut import errors
from tailcut.ml import models
from tailcut.spec import sync_modes, transport_kinds
from tailcut.training import aggregation, flowsection

ROLES = ("ps", "worker", "aggregator", "replica")
SYNC_MODES = sync_modes.NAMES
ORDERINGS = ("fifo", "stf")


class ConfigError(errors.TailcutError):
    """A role config file is unreadable or invalid; the message names the field."""


@dataclass(frozen=True)
class RoleConfig:
    """One process's part in a job. Defaults are the ones the MLP was tuned with."""

    job: str
    role: str  # "ps" or "worker"
    index: int  # worker index 0..num_workers-1; 0 for the PS
    ps_host: str  # the PS binds it; workers connect to it
    ps_port: int
    num_workers: int
    results_dir: str  # CSVs go here; created if missing
    model: str = "mlp"
    batch_size: int = 32  # examples per worker per iteration
    learning_rate: float = 0.3  # SGD step on the worker-averaged gradient
    max_epochs: int = 20
    max_iterations: int | None = None  # stop after this many iterations, if set
    target_accuracy: float | None = 0.9  # stop once test accuracy reaches it, if set
    seed: int = 0  # data, initial parameters and minibatch order
    sync_mode: str = "bsp"
    transport: dict[str, Any] = field(default_factory=lambda: {"type": "tcp"})
    timeout_s: float = 180.0  # whole-job limit; the PS stops the job when it passes
    shard_endpoints: list[str] | None = None  # "host:port" per PS shard; None: ps_host:ps_port
    replica_endpoint: str | None = None  # "host:port" of the PS replica, if any
    aggregators: list[dict[str, Any]] = field(default_factory=list)  # endpoint + workers
    staleness: int = 0  # ssp: iterations a worker may run ahead of the slowest one
    ordering: str = "fifo"  # which waiting update a PS takes first: fifo or stf
    window_us: int = 1000  # concurrent connections are counted per window of this length
    flows: dict[str, Any] | None = None  # CadentFlow cuts and tags (tailcut.training.flows)
    aggregation: str = "mean"  # bsp: how the PS combines what arrived (training.aggregation)
    # The sections of the job's ToR kinds (spec.network.inNetwork), by kind name
    # (tailcut.spec.tor_kinds; the roles' side: training.torkinds), e.g. "aggregation":
    # {"racks": [{"index", "address", "workers"}], "elements"}
    tor: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The transpose all-reduce: each rank's rack (an index), rank 0 first; None: one rack
    # (training.relay)
    rank_racks: list[int] | None = None

    @property
    def hot(self) -> dict[str, Any] | None:
        """The ToR's hot parameters: {"address", "indices", ...} (training.hotset)."""
        return self.tor.get("hot_store")

    @property
    def aggregate(self) -> dict[str, Any] | None:
        """The ToRs' aggregation (training.innetagg)."""
        return self.tor.get("aggregation")

    @property
    def multicast(self) -> dict[str, Any] | None:
        """The ToRs' multicast of the parameters (training.innetmcast)."""
        return self.tor.get("multicast")

    @property
    def shards(self) -> list[tuple[str, int]]:
        """(host, port) of every PS shard, shard 0 first."""
        if self.shard_endpoints is None:
            return [(self.ps_host, self.ps_port)]
        return [split_endpoint(e) for e in self.shard_endpoints]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def replica(self) -> tuple[str, int] | None:
        return None if self.replica_endpoint is None else split_endpoint(self.replica_endpoint)

    def aggregator_of(self, worker: int) -> int | None:
        """Index of the aggregator that serves ``worker``, or None (it pushes directly)."""
        for a, agg in enumerate(self.aggregators):
            if worker in agg["workers"]:
                return a
        return None

    def direct_workers(self) -> list[int]:
        """Workers that push to the shards themselves, not through an aggregator."""
        return [w for w in range(self.num_workers) if self.aggregator_of(w) is None]

    def __post_init__(self) -> None:
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path) -> None:
        """Write this config as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RoleConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(raw))
        if missing:
            raise ConfigError(f"missing field(s) {', '.join(missing)}")
        return cls(**raw)

    @classmethod
    def from_json(cls, path: str | Path) -> RoleConfig:
        """Read and validate a config written by ``to_json`` (or by the runtime)."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"cannot read role config {path}: {err}") from err
        if not isinstance(raw, dict):
            raise ConfigError(
                f"role config {path} must hold a JSON object, not {type(raw).__name__}"
            )
        return cls.from_dict(raw)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``"10.1.0.2:7000"`` -> ``("10.1.0.2", 7000)``; a ConfigError names a bad one."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"endpoint {endpoint!r}: must be host:port with port in 1..65535")
    return host, int(port)


def _check_roles(c: RoleConfig) -> None:
    """Sharding, replica and aggregator fields, and that ``index`` fits the role."""
    _check_shards(c)
    _check_aggregators(c)
    _check_queueing(c)
    _check_flows(c)


def _check_shards(c: RoleConfig) -> None:
    """The shards, the PS replica and the ranks' racks, and a PS's or replica's index."""
    if c.shard_endpoints is not None and (
        not isinstance(c.shard_endpoints, list) or not c.shard_endpoints
    ):
        raise ConfigError(f"shard_endpoints={c.shard_endpoints!r}: must be a non-empty list")
    shards = c.shards  # validates each endpoint
    if c.role == "ps" and not 0 <= c.index < len(shards):
        raise ConfigError(
            f"index={c.index}: a PS's index is its shard, in [0, {len(shards)}) "
            f"for {len(shards)} shard(s)"
        )
    if c.replica_endpoint is not None:
        c.replica  # noqa: B018 - validates the endpoint
        if len(shards) != 1:
            raise ConfigError(
                f"replica_endpoint={c.replica_endpoint!r}: a PS replica needs exactly one "
                f"shard, not {len(shards)}"
            )
    if c.role == "replica" and (c.replica_endpoint is None or c.index != 0):
        raise ConfigError(
            f"role='replica' index={c.index}: needs replica_endpoint and index 0"
        )
    if c.rank_racks is not None and (
        not isinstance(c.rank_racks, list) or len(c.rank_racks) != c.num_workers
        or not all(isinstance(r, int) and not isinstance(r, bool) for r in c.rank_racks)
    ):
        raise ConfigError(f"rank_racks={c.rank_racks!r}: must list one rack index per "
                          f"worker ({c.num_workers})")


def _check_aggregators(c: RoleConfig) -> None:
    """The aggregators: each one's entry, no worker served twice, bsp, and their index."""
    if not isinstance(c.aggregators, list):
        raise ConfigError(f"aggregators={c.aggregators!r}: must be a list")
    seen: dict[int, int] = {}   # worker: the aggregator that serves it
    for a, agg in enumerate(c.aggregators):
        _check_aggregator(c, a, agg, seen)
    if c.aggregators and c.sync_mode != "bsp":
        raise ConfigError(
            f"sync_mode={c.sync_mode!r}: aggregators sum one iteration's updates, so they "
            "need sync_mode bsp"
        )
    if c.role == "aggregator" and not 0 <= c.index < len(c.aggregators):
        raise ConfigError(
            f"role='aggregator' index={c.index}: the config lists "
            f"{len(c.aggregators)} aggregator(s)"
        )


def _check_aggregator(c: RoleConfig, a: int, agg: Any, seen: dict[int, int]) -> None:
    """One entry of ``aggregators`` (the a-th); records its workers in `seen`."""
    if not isinstance(agg, dict) or set(agg) != {"endpoint", "workers"}:
        raise ConfigError(
            f"aggregators[{a}]={agg!r}: must be an object with endpoint and workers"
        )
    split_endpoint(agg["endpoint"])
    workers = agg["workers"]
    if not isinstance(workers, list) or not workers:
        raise ConfigError(f"aggregators[{a}].workers={workers!r}: must be a non-empty list")
    for w in workers:
        if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < c.num_workers:
            raise ConfigError(
                f"aggregators[{a}].workers: {w!r} is not a worker in [0, {c.num_workers})"
            )
        if w in seen:
            raise ConfigError(
                f"aggregators[{a}].workers: worker {w} is already served by "
                f"aggregators[{seen[w]}]"
            )
        seen[w] = a


def _check_queueing(c: RoleConfig) -> None:
    """How a PS takes its updates: staleness, ordering and window."""
    if not isinstance(c.staleness, int) or isinstance(c.staleness, bool) or c.staleness < 0:
        raise ConfigError(f"staleness={c.staleness!r}: must be an integer >= 0")
    if c.ordering not in ORDERINGS:
        raise ConfigError(f"ordering={c.ordering!r}: supported: {', '.join(ORDERINGS)}")
    if not isinstance(c.window_us, int) or c.window_us < 1:
        raise ConfigError(f"window_us={c.window_us!r}: must be an integer >= 1")


def _check_flows(c: RoleConfig) -> None:
    """The ``flows`` section, and that its policy suits the transport and the roles."""
    if c.flows is None:
        return
    try:
        flowsection.check(c.flows)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    policy = c.flows["policy"]
    trait = {"cadentflow": "tags_flows", "coflow": "paces_flows"}.get(policy)
    able = transport_kinds.with_trait(trait) if trait else []
    if trait and c.transport.get("type") not in able:
        raise ConfigError(f"flows.policy={policy!r}: needs transport {', '.join(able)}")
    if policy in ("cadentflow", "coflow") and (c.aggregators or c.replica_endpoint):
        raise ConfigError(f"flows.policy={policy!r}: needs no aggregators and no "
                          "replica_endpoint")


def _check(c: RoleConfig) -> None:
    """Validate field by field; the runtime validated the spec, this guards the file."""
    _check_identity(c)
    _check_model(c)
    _check_training(c)
    _check_sync(c)
    _check_transport(c)
    _check_roles(c)


def _check_identity(c: RoleConfig) -> None:
    """The fields' types, then who this role is and where the PS listens."""
    _typed(c, "job", str)
    _typed(c, "ps_host", str)
    _typed(c, "results_dir", str)
    for name in ("index", "ps_port", "num_workers", "batch_size", "max_epochs", "seed"):
        _typed(c, name, int)
    if c.role not in ROLES:
        raise ConfigError(f"role={c.role!r}: must be one of {', '.join(ROLES)}")
    if c.num_workers < 1:
        raise ConfigError(f"num_workers={c.num_workers}: must be >= 1")
    if c.role == "worker" and not 0 <= c.index < c.num_workers:
        raise ConfigError(
            f"index={c.index}: a worker's index must be in [0, num_workers={c.num_workers})"
        )
    if not 1 <= c.ps_port <= 65535:
        raise ConfigError(f"ps_port={c.ps_port}: must be in 1..65535")


def _check_model(c: RoleConfig) -> None:
    """The model is one tailcut knows or a torch factory; allreduce needs torch workers."""
    if c.model not in models.names() and not models.is_torch(c.model):
        raise ConfigError(f"model={c.model!r}: supported models are {', '.join(models.names())} "
                          f"and {models.TORCH_PREFIX}<package.module:factory>")
    if c.sync_mode in SYNC_MODES and not sync_modes.get(c.sync_mode).has_ps and (
            c.role != "worker" or not models.is_torch(c.model)):
        raise ConfigError(f"sync_mode={c.sync_mode!r}: runs workers of a torch model, not "
                          f"role={c.role!r} model={c.model!r}")


def _check_training(c: RoleConfig) -> None:
    """Batch size, learning rate and the stopping conditions."""
    if c.batch_size < 1:
        raise ConfigError(f"batch_size={c.batch_size}: must be >= 1")
    if not (
        isinstance(c.learning_rate, (int, float))
        and math.isfinite(c.learning_rate)
        and c.learning_rate > 0
    ):
        raise ConfigError(f"learning_rate={c.learning_rate}: must be a finite number > 0")
    if c.max_epochs < 1:
        raise ConfigError(f"max_epochs={c.max_epochs}: must be >= 1")
    if c.max_iterations is not None and (
        not isinstance(c.max_iterations, int) or c.max_iterations < 1
    ):
        raise ConfigError(f"max_iterations={c.max_iterations}: must be >= 1 or null for no limit")
    if c.target_accuracy is not None and not (
        isinstance(c.target_accuracy, (int, float)) and 0 < c.target_accuracy <= 1
    ):
        raise ConfigError(
            f"target_accuracy={c.target_accuracy}: must be in (0, 1] or null for none"
        )


def _check_sync(c: RoleConfig) -> None:
    """The sync mode, and an aggregation other than mean only under bsp."""
    if c.sync_mode not in SYNC_MODES:
        raise ConfigError(f"sync_mode={c.sync_mode!r}: supported: {', '.join(SYNC_MODES)}")
    try:
        aggregation.check(c.aggregation)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if c.aggregation != "mean" and c.sync_mode != "bsp":
        raise ConfigError(f"aggregation={c.aggregation!r}: combines a bsp iteration's pushes, "
                          f"so it needs sync_mode bsp, not {c.sync_mode!r}")


def _check_transport(c: RoleConfig) -> None:
    """The transport is an object naming a known type; the timeout is positive."""
    if not isinstance(c.transport, dict) or not isinstance(c.transport.get("type"), str):
        raise ConfigError(
            f'transport={c.transport!r}: must be an object with a "type", e.g. {{"type": "tcp"}}'
        )
    if c.transport["type"] not in transport_kinds.names():
        raise ConfigError(f"transport.type={c.transport['type']!r}: supported: "
                          f"{', '.join(transport_kinds.names())}")
    if not (isinstance(c.timeout_s, (int, float)) and c.timeout_s > 0):
        raise ConfigError(f"timeout_s={c.timeout_s}: must be > 0")


def _typed(c: RoleConfig, name: str, kind: type) -> None:
    value = getattr(c, name)
    # bool is an int in Python; a true/false where a number belongs is a mistake.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: must be {kind.__name__}")
