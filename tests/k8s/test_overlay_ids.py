"""Overlay ids (a job's VXLAN id) are chosen by the operator among the ids no other
TrainingJob holds, not derived from the job's name."""

import hashlib
import itertools

import pytest

from tailcut.k8s.manifests import overlay_ids


def name_hash_24(key):
    """The VXLAN id the agent took before the operator allocated them: 24 bits of a
    hash of <namespace>/<job>."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) or 1


def colliding_names(namespace, prefix="vni"):
    """Two job names whose <namespace>/<name> hash to the same 24 bits (a few
    thousand tries: the birthday bound of 2**24)."""
    seen = {}
    for i in itertools.count():
        name = f"{prefix}-{i}"
        found = name_hash_24(f"{namespace}/{name}")
        if found in seen:
            return seen[found], name
        seen[found] = name


def test_the_ids_held_are_read_from_the_jobs_status():
    jobs = [{"metadata": {"namespace": "a", "name": "x"}, "status": {"overlayId": 7}},
            {"metadata": {"namespace": "b", "name": "y"}, "status": {}},
            {"metadata": {"namespace": "b", "name": "z"}}]
    assert overlay_ids.taken(jobs) == {7: "a/x"}


def test_a_chosen_id_is_never_one_held():
    picks = iter([6, 6, 99])   # randbelow's answers: 7 (held), 7 again, then 100
    assert overlay_ids.choose({7: "a/x"}, pick=lambda n: next(picks)) == 100
    assert overlay_ids.FIRST <= overlay_ids.choose({}) <= overlay_ids.LAST


def test_the_status_field_is_checked_where_it_is_read():
    assert overlay_ids.from_status({}) is None
    assert overlay_ids.from_status({"overlayId": 16777215}) == 16777215
    for wrong in (0, -1, 2 ** 24, "12", 1.5, False):
        with pytest.raises(ValueError, match=r"status.overlayId=.*: not a VXLAN id"):
            overlay_ids.from_status({"overlayId": wrong})


def test_names_whose_hashes_collide_are_found_in_moments():
    first, second = colliding_names("lab")
    assert first != second
    assert name_hash_24(f"lab/{first}") == name_hash_24(f"lab/{second}")
