"""`python -m tailcut.k8s.agent`: the DaemonSet's entry point (operator/agent.Dockerfile).
Reads its node from NODE_NAME, takes over the fabrics a previous agent left with the
holder (TAILCUT_HOLDER_SOCKET, holder.py), serves /metrics and /healthz, follows the
node's pods until SIGTERM, then unwires them all, unless only its container stops
(the holder stays): then it leaves them to the next agent."""

import logging
import os
import signal
import sys
import time
from typing import Any

from tailcut.errors import TailcutError
from tailcut.k8s import metrics
from tailcut.k8s.agent import admission, daemon, holder

log = logging.getLogger("tailcut.agent")


def main() -> int:
    import kubernetes
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    node = os.environ.get("NODE_NAME")
    if not node:
        print("tailcut agent: NODE_NAME is not set (the DaemonSet sets it from "
              "spec.nodeName)", file=sys.stderr)
        return 2
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    agent = daemon.Agent(kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi(),
                         node, os.environ.get("TAILCUT_SHAPE_HOST_NETWORK", "false") == "true",
                         keeper=holder.from_environment())
    agent.take_over()
    signal.signal(signal.SIGTERM, _stop)   # the DaemonSet's pod is deleted or rolled
    last_seen = [time.monotonic()]
    # Healthy while the watch delivers: a list, events, or its bookmarks and reconnects
    # at least every WATCH_S.
    def healthy() -> bool:
        return time.monotonic() - last_seen[0] < 3 * daemon.WATCH_S

    # /metrics for Prometheus on the node's addresses (any pod can connect to them:
    # the server bounds what connections may hold); the kubelet's probes on the node's
    # loopback, which no pod reaches, so no pod can fail them. The chart sets both.
    port = int(os.environ.get("TAILCUT_METRICS_PORT", "0"))
    if port:
        metrics.serve(metrics.agent_registry, port, healthy,
                      host=os.environ.get("TAILCUT_METRICS_ADDRESS") or "0.0.0.0")
    health_port = int(os.environ.get("TAILCUT_HEALTH_PORT", "0"))
    if health_port:
        metrics.serve(metrics.agent_registry, health_port, healthy, host="127.0.0.1")
    try:
        while True:
            last_seen[0] = time.monotonic()
            try:
                for event_type, pod in agent.events():
                    last_seen[0] = time.monotonic()
                    try:
                        agent.handle(event_type, pod)
                    except admission.Refused as err:   # it names the pod itself
                        log.warning(str(err))
                    except TailcutError as err:
                        log.error(f"{pod.metadata.namespace}/{pod.metadata.name}: {err}")
                    except Exception:   # noqa: BLE001 - one pod must not end the agent
                        # (and with it every job's links on the node): log, go on.
                        log.exception(f"{pod.metadata.namespace}/{pod.metadata.name}: "
                                      "not wired")
            except kubernetes.client.ApiException as err:
                log.warning(f"watch ended: {err.status} {err.reason}; reconnecting")
                time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        if agent.leaves_fabrics():
            log.info(f"stopping; the pod stays: {len(agent.fabrics)} jobs' fabrics are left "
                     "to the next agent (the holder keeps them)")
        else:
            # Leave no link, classifier or dropper of ours on pods the next agent may
            # never see (the chart uninstalled); one that comes back wires them again.
            agent.release_all()
    return 0


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
