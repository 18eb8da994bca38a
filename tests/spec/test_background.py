"""The backgroundLoad section: a valid example, and one readable error per bad value."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError

HEADER = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {name: bg-spec}
spec:
  replicas: {workers: 2}
  network: {racks: [{name: rack-0}, {name: rack-1}], placement: {ps-0: rack-0}}
"""
GOOD = """\
  backgroundLoad:
    senders: [rack-0]
    receivers: [rack-1]
    target: {link: uplink/rack-0, loadFactor: 0.5}
    flowSizes: {distribution: web-search}
    shape: {type: steps, steps: [{atS: 0, scale: 0.5}, {atS: 10, scale: 1.0}]}
    durationS: 30
"""


def load(background: str) -> spec.TrainingJob:
    return spec.load_text(HEADER + background)


def error_of(background: str) -> str:
    with pytest.raises(SpecError) as info:
        load(background)
    return str(info.value)


def with_(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


def test_a_full_background_load_loads_with_its_values():
    b = load(GOOD).spec.background_load
    assert b is not None
    assert (b.senders, b.receivers) == (["rack-0"], ["rack-1"])
    assert b.target.load_factor == 0.5 and b.target.link == "uplink/rack-0"
    assert b.flow_sizes.mean_bytes() == pytest.approx(1_711_250)
    assert [b.shape.scale_at(t) for t in (0, 9.9, 10, 100)] == [0.5, 0.5, 1.0, 1.0]
    assert b.duration_s == 30 and b.warmup_s == 2.0


def test_a_job_without_background_load_has_none():
    assert load("").spec.background_load is None


def test_a_training_pod_can_be_an_end_and_its_access_link_the_target():
    b = load(GOOD.replace("receivers: [rack-1]", "receivers: [ps-0]")
             .replace("senders: [rack-0]", "senders: [rack-1]")
             .replace("uplink/rack-0", "access/ps-0")).spec.background_load
    assert b is not None and b.receivers == ["ps-0"]


def test_on_off_bursts_alternate_full_load_and_silence():
    b = load(with_("{type: steps, steps: [{atS: 0, scale: 0.5}, {atS: 10, scale: 1.0}]}",
                   "{type: onOff, onS: 2, offS: 3}")).spec.background_load
    assert b is not None
    assert [b.shape.scale_at(t) for t in (0, 1.9, 2, 4.9, 5, 7)] == [1, 1, 0, 0, 1, 0]


def test_a_fixed_size_needs_bytes_and_has_that_mean():
    b = load(with_("{distribution: web-search}", "{distribution: fixed, bytes: 1000}")
             ).spec.background_load
    assert b is not None and b.flow_sizes.mean_bytes() == 1000
    assert "spec.backgroundLoad.flowSizes.bytes: distribution fixed needs bytes" in error_of(
        with_("{distribution: web-search}", "{distribution: fixed}"))


@pytest.mark.parametrize("old, new, message", [
    ("distribution: web-search", "distribution: websearch",
     "spec.backgroundLoad.flowSizes.distribution: unknown distribution 'websearch'; "
     "known: web-search, data-mining, fixed"),
    ("loadFactor: 0.5", "loadFactor: 1.5",
     "spec.backgroundLoad.target.loadFactor=1.5: must be less than or equal to 1"),
    ("loadFactor: 0.5", "loadFactor: 0.5, requestsPerS: 10",
     "spec.backgroundLoad.target.loadFactor: give exactly one of loadFactor"),
    ("{link: uplink/rack-0, loadFactor: 0.5}", "{loadFactor: 0.5}",
     "spec.backgroundLoad.target.link: a loadFactor needs the link it loads"),
    ("uplink/rack-0", "uplink/rack-9",
     "spec.backgroundLoad.target.link: no rack 'rack-9'"),
    ("uplink/rack-0", "spine/rack-0",
     "spec.backgroundLoad.target.link: 'spine/rack-0' is not a link name"),
    ("uplink/rack-0", "access/worker-0",
     "spec.backgroundLoad.target.link: flows from rack-0 to rack-1 do not cross "
     "access/worker-0"),
    ("senders: [rack-0]", "senders: [rack-7]",
     "spec.backgroundLoad.senders[0]: 'rack-7' is neither a rack"),
    ("receivers: [rack-1]", "receivers: [rack-1, rack-1]",
     "spec.backgroundLoad.receivers[1]: 'rack-1' is listed twice"),
    ("receivers: [rack-1]", "receivers: [rack-0]",
     "spec.backgroundLoad.receivers: rack-0 also sends"),
    ("receivers: [rack-1]", "receivers: []",
     "spec.backgroundLoad.receivers: List should have at least 1 item"),
    ("{atS: 10, scale: 1.0}", "{atS: 0, scale: 1.0}",
     "spec.backgroundLoad.shape.steps[1].atS: 0 must be after steps[0].atS (0)"),
    ("[{atS: 0, scale: 0.5}, ", "[",
     "spec.backgroundLoad.shape.steps[0].atS: 10: the first step must start at 0"),
    ("{type: steps, steps: [{atS: 0, scale: 0.5}, {atS: 10, scale: 1.0}]}",
     "{type: onOff, onS: 2}", "spec.backgroundLoad.shape.offS: type onOff needs onS and offS"),
    ("{type: steps, steps: [{atS: 0, scale: 0.5}, {atS: 10, scale: 1.0}]}",
     "{type: sawtooth}", "spec.backgroundLoad.shape.type='sawtooth': must be 'constant', "
     "'steps' or 'onOff'"),
    ("durationS: 30", "durationS: -1",
     "spec.backgroundLoad.durationS=-1: must be greater than 0"),
    ("durationS: 30", "duration: 30",
     "spec.backgroundLoad.duration: unknown field (did you mean durationS?)"),
])
def test_an_invalid_value_is_refused_naming_its_field(old, new, message):
    assert message in error_of(with_(old, new))


def test_the_quickstart_background_example_is_valid():
    job = spec.load_file("examples/quickstart-background.yaml")
    b = job.spec.background_load
    assert b is not None and b.target.load_factor == 0.5 and b.receivers == ["ps-0"]
