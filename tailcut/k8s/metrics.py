"""Prometheus metrics of the operator and the node agent, and the HTTP endpoint
that serves them with a health check (the chart's probes and Services point at it;
tailcut.k8s.httpd bounds what its clients may hold).

    GET /metrics   Prometheus text format
    GET /healthz   200 while the component's `healthy()` says so, else 503

Operator: tailcut_operator_jobs{phase} (TrainingJobs it last saw in each phase),
tailcut_operator_reconcile_errors_total, tailcut_operator_reconcile_seconds.
Agent: tailcut_agent_shaped_pods (now), tailcut_agent_pods_shaped_total,
tailcut_agent_shaping_failures_total, tailcut_agent_classified_packets_total{level}
(CadentFlow classifier, counted when a pod is released),
tailcut_agent_queue_drops_total (full link buffers: a pod's access link counted when
the pod is released, an uplink when its job's fabric is removed).
"""

import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from tailcut.k8s import httpd

METRICS_PORT = 9100   # the chart's Services name it `metrics`

# One registry per component: the operator's /metrics has no agent series and the
# agent's none of the operator's (a zero from the wrong component would mislead).
operator_registry = CollectorRegistry()
agent_registry = CollectorRegistry()
reconcile_errors = Counter("tailcut_operator_reconcile_errors_total",
                           "reconciles of a TrainingJob that raised",
                           registry=operator_registry)
reconcile_seconds = Histogram("tailcut_operator_reconcile_seconds",
                              "time to reconcile a TrainingJob (create its objects)",
                              registry=operator_registry)
pods_shaped_total = Counter("tailcut_agent_pods_shaped_total",
                            "pods whose links the agent shaped", registry=agent_registry)
pods_shaped = Gauge("tailcut_agent_shaped_pods", "pods the agent keeps shaped now",
                    registry=agent_registry)
shaping_failures = Counter("tailcut_agent_shaping_failures_total",
                           "pods the agent failed to shape or release",
                           registry=agent_registry)
classified_packets = Counter("tailcut_agent_classified_packets_total",
                             "packets the CadentFlow classifier put in each priority level",
                             ["level"], registry=agent_registry)
queue_drops = Counter("tailcut_agent_queue_drops_total",
                      "packets the queues of jobs' links dropped because they were full",
                      registry=agent_registry)


class JobPhases:
    """tailcut_operator_jobs{phase}: the phase the operator last wrote for each job."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def set(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            self._phases[(namespace, name)] = phase

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._phases.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("tailcut_operator_jobs", "TrainingJobs by phase",
                                   labels=["phase"])
        with self._lock:
            phases = list(self._phases.values())
        for phase in ("Pending", "Running", "Succeeded", "Failed"):
            family.add_metric([phase], phases.count(phase))
        yield family


job_phases = JobPhases()
operator_registry.register(job_phases)


def serve(registry: CollectorRegistry, port: int = METRICS_PORT,
          healthy: Callable[[], bool] = lambda: True, host: str = "0.0.0.0",
          max_connections: int = httpd.MAX_CONNECTIONS) -> httpd.Server:
    """Serve `registry` at /metrics and /healthz on (`host`, `port`) from a daemon
    thread, with a bound on connections and a timeout on each (tailcut.k8s.httpd)."""

    def respond(path: str) -> tuple[int, bytes, str]:
        if path.startswith("/metrics"):
            return 200, generate_latest(registry), "text/plain; version=0.0.4"
        if path.startswith("/healthz"):
            ok = healthy()
            return (200 if ok else 503), (b"ok\n" if ok else b"unhealthy\n"), "text/plain"
        return 404, b"not found\n", "text/plain"

    return httpd.Server(host, port, respond, max_connections=max_connections,
                        name=f"metrics:{port}")
