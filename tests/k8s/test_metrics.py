"""The operator's and the agent's /metrics and /healthz (the chart's probes and
Services point at them): each component serves its own series only."""

import urllib.error
import urllib.request

import pytest

from tailcut.k8s import metrics


def get(server, path):
    host, port = "127.0.0.1", server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def servers():
    healthy = {"agent": True}
    started = {"operator": metrics.serve(metrics.operator_registry, port=0),
               "agent": metrics.serve(metrics.agent_registry, port=0,
                                      healthy=lambda: healthy["agent"])}
    yield started, healthy
    for server in started.values():
        server.shutdown()
        server.server_close()


def test_each_component_serves_its_own_series_only(servers):
    started, _ = servers
    metrics.job_phases.set("ns", "m-job", "Running")
    metrics.pods_shaped_total.inc()
    try:
        _, operator_text = get(started["operator"], "/metrics")
        _, agent_text = get(started["agent"], "/metrics")
    finally:
        metrics.job_phases.forget("ns", "m-job")
    assert 'tailcut_operator_jobs{phase="Running"} 1.0' in operator_text
    assert "tailcut_operator_reconcile_seconds_count" in operator_text
    assert "tailcut_agent_" not in operator_text
    assert "tailcut_agent_pods_shaped_total" in agent_text
    assert "tailcut_operator_" not in agent_text


def test_healthz_follows_the_components_health(servers):
    started, healthy = servers
    assert get(started["agent"], "/healthz") == (200, "ok\n")
    healthy["agent"] = False
    assert get(started["agent"], "/healthz") == (503, "unhealthy\n")
    assert get(started["agent"], "/nothing")[0] == 404
