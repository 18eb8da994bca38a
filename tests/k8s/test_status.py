"""Conditions follow the Kubernetes shape and keep their transition times."""

from tailcut.k8s import status


def test_exactly_one_of_running_succeeded_failed_is_true():
    conds = status.phase_conditions("Failed", "PodFailed", "worker-1 exited")
    true = [c["type"] for c in conds if c["status"] == "True"]
    assert true == ["Created", "Failed"]
    assert {"type", "status", "reason", "message", "lastTransitionTime"} <= set(conds[1])


def test_merge_keeps_the_transition_time_when_the_status_did_not_change():
    old = [status.condition("Running", True, "AllPodsRunning", at="2020-01-01T00:00:00Z")]
    merged = status.merge_conditions(old, [status.condition("Running", True, "AllPodsRunning")])
    assert merged[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped = status.merge_conditions(old, [status.condition("Running", False, "X")])
    assert flipped[0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
