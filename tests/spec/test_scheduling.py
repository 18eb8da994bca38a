"""The spec's scheduling section: the policy switch and per-flow tags."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError

HEADER = "apiVersion: tailcut.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: cf-demo}\n"


def load(body: str) -> spec.TrainingJob:
    return spec.load_text(HEADER + body)


def error_of(body: str) -> str:
    with pytest.raises(SpecError) as info:
        load(body)
    return str(info.value)


def test_scheduling_defaults_to_fair_with_tags_derived_from_the_model():
    s = load("spec: {}").spec.scheduling
    assert (s.policy, s.derive_tags, s.flows) == ("fair", True, [])


def test_hand_written_tags_are_read_in_camel_case():
    s = load("spec: {scheduling: {policy: cadentflow, objective: minMaxDelay, flows: "
             "[{layer: W1, direction: pull, priority: 0, deadlineMs: 3, weight: 2}]}}"
             ).spec.scheduling
    tag = s.flows[0]
    assert (tag.layer, tag.direction, tag.priority, tag.deadline_ms, tag.weight) == \
        ("W1", "pull", 0, 3.0, 2.0)


def test_an_unknown_policy_is_named_with_the_choices():
    message = error_of("spec: {scheduling: {policy: edf}}")
    assert "spec.scheduling.policy='edf'" in message
    assert "fair, coflow, cadentflow" in message


def test_a_priority_beyond_the_levels_names_the_tag():
    message = error_of("spec: {scheduling: {policy: cadentflow, priorityLevels: 2, "
                       "flows: [{layer: W1, priority: 5}]}}")
    assert "spec.scheduling.flows[0].priority: 5 is not a level" in message


def test_tags_without_cadentflow_are_refused():
    message = error_of("spec: {scheduling: {flows: [{layer: W1, priority: 0}]}}")
    assert "spec.scheduling.flows: per-flow tags need policy cadentflow" in message


def test_a_deadline_needs_the_min_max_delay_objective():
    message = error_of("spec: {scheduling: {policy: cadentflow, "
                       "flows: [{layer: W1, deadlineMs: 4}]}}")
    assert "spec.scheduling.flows[0].deadlineMs: deadlines need objective minMaxDelay" \
        in message


def test_a_misspelt_field_gets_a_suggestion():
    assert "did you mean priorityLevels" in error_of(
        "spec: {scheduling: {priorityLevel: 3}}")
