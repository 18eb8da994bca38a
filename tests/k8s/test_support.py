"""What the Kubernetes path refuses before anything is created, each naming its field."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError
from tailcut.k8s import support


def job(**job_spec):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "k8-support"}, "spec": job_spec})


@pytest.mark.parametrize("transport", [{"type": "tcp"}, {"type": "app-drop", "p": 0.9}])
def test_a_one_ps_job_over_tcp_or_app_drop_runs_on_kubernetes(transport):
    support.check(job(transport=transport))


@pytest.mark.parametrize("transport", [{"type": "udp"}, {"type": "bounded-loss", "p": 0.9}])
def test_a_datagram_transport_is_refused_naming_spec_transport_type(transport):
    with pytest.raises(SpecError, match=rf"^spec.transport.type='{transport['type']}': the "
                                        "Kubernetes path runs tcp and app-drop only"):
        support.check(job(transport=transport))


@pytest.mark.parametrize("replicas, field", [
    ({"parameterServers": 2}, r"spec.replicas.parameterServers=2"),
    ({"psReplica": True}, r"spec.replicas.psReplica=True"),
    ({"workers": 4, "aggregators": [{"workers": [0, 1]}]}, r"spec.replicas.aggregators=1"),
])
def test_roles_the_entrypoint_does_not_wire_are_refused_by_field(replicas, field):
    with pytest.raises(SpecError, match=f"^{field}: the Kubernetes path runs one parameter"):
        support.check(job(replicas=replicas))
