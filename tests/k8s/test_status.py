"""Conditions follow the Kubernetes shape and keep their transition times."""

from tailcut.k8s.manifests import status


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


def test_each_condition_names_the_generation_it_was_set_from():
    conds = status.phase_conditions("Running", "AllPodsRunning", "3 pods running",
                                    generation=4)
    assert {c["observedGeneration"] for c in conds} == {4}


def test_a_job_that_failed_before_its_objects_existed_is_not_created():
    conds = {c["type"]: c for c in status.phase_conditions(
        "Failed", "InvalidSpec", "spec.network.placement.ps-0: no rack 'x'", created=None)}
    assert (conds["Created"]["status"], conds["Created"]["reason"]) == ("False", "InvalidSpec")
    assert conds["Failed"]["status"] == "True"


def test_a_long_message_is_cut_saying_so():
    long = "pod demo-worker-3: " + "x" * 10_000
    (cond,) = [c for c in status.phase_conditions("Failed", "PodFailed", long)
               if c["type"] == "Failed"]
    assert len(cond["message"]) == status.MESSAGE_MAX_CHARS
    assert cond["message"].startswith("pod demo-worker-3: ") and cond["message"].endswith(
        "(cut)")
    assert status.capped("short") == "short"
