"""The plan of a job's in-network work (spec.network.inNetwork): each kind's section of
the role configurations, resolved once as data (tailcut.plan.in_network), which the
roles read and tailcut.innetwork's programs are loaded with.

Pure, apart from tailcut.innetwork (which loads the BPF programs and wires them into a
built network), so that the operator plans a job without netlink or BCC. A kind is
one ``KindPlan`` here and one ``Kind`` of the same name there:

- ``section(job, topo)``: what it needs from the plan (addresses, racks, workers;
  JSON), None when the job does not ask for it. Cheap.
- ``resolve(job, section)``: what costs compute (the hot set: profiling the model),
  done once by `tailcut run` or the operator; the identity for most.
- ``check(job, parameters)``: refuse a job asking for more than the program holds,
  given the model's parameter count, raising SpecError naming the field; before
  anything is built (tailcut.plan). Nothing, for a kind that holds any model.

Which kinds there are is tailcut.spec.tor_kinds's registry (``kinds()``): tailcut's
three, then those installed packages register.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from tailcut import ebpfheaders
from tailcut.errors import SpecError
from tailcut.ml import data, models
from tailcut.net import naming
from tailcut.net.topology import Topology
from tailcut.spec import tor_kinds
from tailcut.spec.model import TrainingJob
from tailcut.training import hotchoice

Section = dict[str, Any]        # JSON: what the roles and the programs read
Sections = dict[str, Section]   # kind name -> its resolved section
# The most values of a model the ToR sums (aggregation) or copies (multicast): what
# their programs' maps hold (ebpf/agg.h, ebpf/mcast.h).
AGGREGATE_MAX_ELEMENTS = ebpfheaders.max_elements("agg")
MULTICAST_MAX_ELEMENTS = ebpfheaders.max_elements("mcast")


@dataclass(frozen=True)
class KindPlan:
    """How the plan reaches one kind of ToR program."""

    name: str
    section: Callable[[TrainingJob, Topology], Optional[Section]]
    resolve: Callable[[TrainingJob, Section], Section] = lambda job, section: section
    check: Callable[[TrainingJob, int], None] = lambda job, parameters: None


def worker_racks(topo: Topology, address_of: Callable[[int], str]) -> Section:
    """Each rack with workers, the address its ToR program answers at, its workers."""
    racks = []
    for rack in topo.racks:
        workers = sorted(p.index for p in rack.pods if p.role == "worker")
        if workers:
            racks.append({"index": rack.index, "address": address_of(rack.index),
                          "workers": workers})
    return {"racks": racks}


def _built(job: TrainingJob) -> tuple[models.Model, data.Dataset]:
    """The job's model (a torch module's too: by its model_ref) and its data set."""
    ref, seed = job.spec.training.model_ref, job.spec.training.seed
    dataset = models.dataset(ref, seed)
    return models.create(ref, dataset), dataset


def with_model_length(job: TrainingJob, spec_section: Section) -> Section:
    """`spec_section` with the model's length, "elements" (building the model tells
    it), resolved once as data for the node."""
    return {**spec_section, "elements": _built(job)[0].num_params}


# ---- the hot-parameter store: one program, in ps-0's rack ------------------------------

def hot_store_section(job: TrainingJob, topo: Topology) -> Optional[Section]:
    """The store's address, in ps-0's rack, and which parameters it holds as the spec
    says (top_k, or indices); None when the job puts none in the ToR."""
    in_network = job.spec.network.in_network
    if in_network is None or in_network.hot_parameters is None:
        return None
    hot = in_network.hot_parameters
    rack = topo.pod("ps-0").rack
    return {"address": naming.hot_store_ip(rack), "rack": rack, "top_k": hot.top_k,
            "indices": None if hot.indices is None else sorted(hot.indices)}


def resolve_hot_store(job: TrainingJob, spec_section: Section) -> Section:
    """The hot set chosen (top_k: profiling the model's gradients) and the store's
    initial values, once, as data: the roles and the node agent take them as they are."""
    t = job.spec.training
    model, dataset = _built(job)
    index = hotchoice.select(spec_section, model, dataset, t.batch_size, t.seed)
    initial = model.init_params(np.random.default_rng(t.seed))[index].astype("<f4")
    return {"address": spec_section["address"], "rack": spec_section["rack"],
            "top_k": None, "indices": [int(i) for i in index],
            "initial": base64.b64encode(initial.tobytes()).decode()}


# ---- aggregation and multicast: one program per rack with workers ----------------------

def aggregation_section(job: TrainingJob, topo: Topology) -> Optional[Section]:
    """Each rack with workers, its aggregation address and its workers; None when the
    job does not aggregate. (Resolving adds the gradient's length.)"""
    in_network = job.spec.network.in_network
    if in_network is None or not in_network.aggregate:
        return None
    return worker_racks(topo, naming.aggregation_ip)


def multicast_section(job: TrainingJob, topo: Topology) -> Optional[Section]:
    """Each rack with workers, its multicast address and its workers; None when the
    job does not multicast."""
    in_network = job.spec.network.in_network
    if in_network is None or not in_network.multicast:
        return None
    return worker_racks(topo, naming.multicast_ip)


def check_hot_store(job: TrainingJob, parameters: int) -> None:
    """The hot parameters the spec names must be the model's."""
    in_network = job.spec.network.in_network
    hot = in_network.hot_parameters if in_network is not None else None
    if hot is None:
        return
    wanted = hot.top_k if hot.top_k is not None else max(hot.indices or [0]) + 1
    if wanted > parameters:
        what = f"topK: {hot.top_k}" if hot.top_k is not None else f"indices: {wanted - 1}"
        raise SpecError(f"spec.network.inNetwork.hotParameters.{what} is past model "
                        f"{job.spec.training.model}'s {parameters} parameters")


def check_aggregation(job: TrainingJob, parameters: int) -> None:
    """The whole gradient must fit the ToR's sums (with a hot set, the ToR sums only
    that set's part, which the hot store's check bounds)."""
    in_network = job.spec.network.in_network
    if in_network is None or not in_network.aggregate or in_network.hot_parameters:
        return
    if parameters > AGGREGATE_MAX_ELEMENTS:
        raise SpecError(f"spec.network.inNetwork.aggregate: model {job.spec.training.model} "
                        f"has {parameters} parameters; the ToR sums at most "
                        f"{AGGREGATE_MAX_ELEMENTS}")


def check_multicast(job: TrainingJob, parameters: int) -> None:
    in_network = job.spec.network.in_network
    if in_network is None or not in_network.multicast:
        return
    if parameters > MULTICAST_MAX_ELEMENTS:
        raise SpecError(f"spec.network.inNetwork.multicast: model {job.spec.training.model} "
                        f"has {parameters} parameters; the ToR copies at most "
                        f"{MULTICAST_MAX_ELEMENTS}")


HOT_STORE = KindPlan("hot_store", hot_store_section, resolve_hot_store, check_hot_store)
AGGREGATION = KindPlan("aggregation", aggregation_section, with_model_length,
                       check_aggregation)
MULTICAST = KindPlan("multicast", multicast_section, with_model_length, check_multicast)
KINDS: tuple[KindPlan, ...] = (HOT_STORE, AGGREGATION, MULTICAST)


def kinds() -> tuple[KindPlan, ...]:
    """The plan of every registered ToR kind (tailcut.spec.tor_kinds), tailcut's first."""
    found: tuple[KindPlan, ...] = tor_kinds.parts("plan", KindPlan)
    return found


def options(job: TrainingJob, name: str) -> Optional[Section]:
    """The options a job gives a registered kind of its own (``inNetwork.kinds``), or
    None when it does not ask for it."""
    in_network = job.spec.network.in_network
    if in_network is None or name not in in_network.kinds:
        return None
    return dict(in_network.kinds[name])


def sections(job: TrainingJob, topo: Topology) -> Sections:
    """The resolved section of every kind the job enables, by name."""
    found: Sections = {}
    for kind in kinds():
        section = kind.section(job, topo)
        if section is not None:
            found[kind.name] = kind.resolve(job, section)
    return found
