"""Per-tensor cuts of a shard's messages and their flows-*.csv rows."""

import numpy as np
import pytest

from tailcut.training import flows, flowsection
from tailcut.ml.models import layout
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

LAYERS = layout([("a", (4,)), ("b", (2, 3)), ("c", (2,))])  # offsets 0, 4, 10; 12 values


def test_pieces_are_the_tensors_overlapping_a_shard_relative_to_its_start():
    assert flows.pieces(LAYERS, 0, 12) == [("a", 0, 4), ("b", 4, 6), ("c", 10, 2)]
    assert flows.pieces(LAYERS, 3, 11) == [("a", 0, 1), ("b", 1, 6), ("c", 7, 1)]


def test_cuts_go_most_urgent_level_first_then_in_forward_order():
    cuts = flows.cuts(LAYERS, 0, 12, {"a": 1, "b": 0, "c": 1})
    assert cuts == (base.Cut(4, 6, 0), base.Cut(0, 4, 1), base.Cut(10, 2, 1))


def test_a_message_delivered_whole_gives_every_tensor_the_messages_completion():
    msg = Message(Kind.PARAMS, 2, -1, np.zeros(12, np.float32), sent_at_ns=1_000,
                  received_at_ns=3_000)
    rows = flows.rows(msg, "worker-0", LAYERS, 0, 12, None)
    assert [(r["layer"], r["level"], r["bytes"], r["completion_s"]) for r in rows] == [
        ("a", "", 16, "0.000002000"), ("b", "", 24, "0.000002000"),
        ("c", "", 8, "0.000002000")]


def test_a_message_in_parts_gives_each_tensor_its_own_completion_and_level():
    parts = [base.Part(4, 6, 0, 1_000, 1_500), base.Part(0, 4, 1, 1_000, 2_000),
             base.Part(10, 2, 1, 1_000, 2_500)]
    msg = Message(Kind.PUSH, 0, 1, np.zeros(12, np.float32), sent_at_ns=1_000,
                  received_at_ns=2_500, parts=parts)
    rows = flows.rows(msg, "ps-0", LAYERS, 0, 12, {"a": 1, "b": 0, "c": 1})
    assert [(r["layer"], r["level"], r["received_at_ns"]) for r in rows] == [
        ("a", 1, 2_000), ("b", 0, 1_500), ("c", 1, 2_500)]


def test_levels_must_name_exactly_the_models_tensors():
    raw = {"policy": "cadentflow", "pull": {"a": 0, "b": 0}, "push": {"a": 0, "b": 0, "c": 0}}
    with pytest.raises(ValueError, match="flows.pull names a, b; the model's tensors are a, b, c"):
        flows.levels_for(raw, "pull", LAYERS)
    assert flows.levels_for({"policy": "fair"}, "pull", LAYERS) is None


@pytest.mark.parametrize("raw, message", [
    ({"policy": "edf"}, "policy one of fair, cadentflow"),
    ({"policy": "cadentflow", "pull": [], "push": {}}, "flows.pull"),
    ({"policy": "cadentflow", "pull": {"a": 9}, "push": {}}, r"flows.pull.a=9: must be a level"),
])
def test_a_bad_flows_section_is_refused_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=message):
        flowsection.check(raw)


def test_a_sharded_cadentflow_job_sends_each_shards_tensors_as_tagged_parts(tmp_path):
    import csv

    from tests.training import loopback

    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    levels = {name: k for k, name in enumerate(names)}
    job = loopback.Job(tmp_path, num_workers=2, shards=2, options={
        "max_iterations": 10, "target_accuracy": None,
        "flows": {"policy": "cadentflow", "pull": levels, "push": levels}})
    events = job.run()
    assert events["ps-0"][-1]["iterations"] == 10
    with open(job.results / "flows-worker-0.csv", newline="") as f:
        pulls = list(csv.DictReader(f))
    # shard 0 holds part of fc1.weight, shard 1 the rest of it and every other tensor
    per_iteration = {}
    for row in pulls:
        per_iteration.setdefault(row["iteration"], []).append((row["layer"], int(row["level"])))
    assert sorted(per_iteration["3"]) == sorted(
        [("fc1.weight", 0), ("fc1.weight", 0), ("fc1.bias", 1), ("fc2.weight", 2),
         ("fc2.bias", 3)])
    with open(job.results / "flows-ps-1.csv", newline="") as f:
        pushes = list(csv.DictReader(f))
    assert {(r["layer"], r["level"]) for r in pushes} == {
        (name, str(k)) for name, k in levels.items()}
    assert all(float(r["completion_s"]) >= 0 for r in pulls + pushes)


# --- coflow (Varys' MADD): untagged per-tensor parts on a paced connection ----------
@pytest.mark.parametrize("raw, message", [
    ({"policy": "coflow"}, r"flows.pace=None: must map each sender"),
    ({"policy": "coflow", "pace": {"ps-0": 5}}, r"flows.pace.ps-0=5: must map each receiver"),
    ({"policy": "coflow", "pace": {"ps-0": {"worker-0": 0}}},
     r"flows.pace.ps-0.worker-0=0: must be a rate > 0"),
    ({"policy": "coflow", "pace": {"ps-0": {"worker-0": True}}}, r"flows.pace.ps-0.worker-0"),
])
def test_a_bad_coflow_section_is_refused_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=message):
        flowsection.check(raw)


def _tcp_pair():
    import socket

    from tailcut.transports import tcp

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return tcp.TcpConnection(client, "peer", 1 << 20), server


def _rate_of(conn):
    import socket
    import struct

    from tailcut.transports import tcp

    raw = conn._sock.getsockopt(socket.SOL_SOCKET, tcp.SO_MAX_PACING_RATE, 4)
    return struct.unpack("I", raw)[0]


def test_coflow_paces_the_flows_connection_and_sends_untagged_parts_in_forward_order():
    conn, server = _tcp_pair()
    try:
        raw = {"policy": "coflow", "pace": {"ps-0": {"worker-0": 123456.7}}}
        flows.pace(conn, raw, "ps-0", "worker-0", Kind.PARAMS, LAYERS, 2, 12)
        assert _rate_of(conn) == 123457
        assert conn.cuts[Kind.PARAMS] == (base.Cut(0, 2, None), base.Cut(2, 6, None),
                                          base.Cut(8, 2, None))
        conn.set_pacing_rate(None)
        assert _rate_of(conn) == 0xFFFFFFFF
    finally:
        conn.close()
        server.close()


def test_coflow_leaves_pairs_without_a_rate_and_other_policies_alone():
    conn, server = _tcp_pair()
    try:
        raw = {"policy": "coflow", "pace": {"ps-0": {"worker-0": 1000.0}}}
        flows.pace(conn, raw, "ps-0", "ps-1", Kind.PARAMS, LAYERS, 0, 12)
        flows.pace(conn, {"policy": "fair"}, "ps-0", "worker-0", Kind.PARAMS, LAYERS, 0, 12)
        flows.pace(conn, None, "ps-0", "worker-0", Kind.PARAMS, LAYERS, 0, 12)
        assert conn.cuts == {} and _rate_of(conn) == 0xFFFFFFFF
    finally:
        conn.close()
        server.close()


def test_a_connection_that_cannot_be_paced_is_refused_under_coflow():
    class Datagram(base.Connection):
        peer = "ps-0"

        def send(self, msg, timeout_s=None): ...
        def recv(self, timeout_s=None): ...
        def close(self): ...

    raw = {"policy": "coflow", "pace": {"w": {"ps-0": 1.0}}}
    with pytest.raises(base.TransportError, match="cannot be paced; coflow needs transport tcp"):
        flows.pace(Datagram(), raw, "w", "ps-0", Kind.PUSH, LAYERS, 0, 12)


def test_a_sharded_coflow_job_sends_every_tensor_as_an_untagged_part(tmp_path):
    import csv

    from tests.training import loopback

    pace = {"ps-0": {"worker-0": 5e7, "worker-1": 5e7}, "ps-1": {"worker-0": 5e7, "worker-1": 5e7},
            "worker-0": {"ps-0": 5e7, "ps-1": 5e7}, "worker-1": {"ps-0": 5e7, "ps-1": 5e7}}
    job = loopback.Job(tmp_path, num_workers=2, shards=2, options={
        "max_iterations": 10, "target_accuracy": None,
        "flows": {"policy": "coflow", "pace": pace}})
    events = job.run()
    assert events["ps-0"][-1]["iterations"] == 10
    with open(job.results / "flows-worker-0.csv", newline="") as f:
        pulls = list(csv.DictReader(f))
    with open(job.results / "flows-ps-1.csv", newline="") as f:
        pushes = list(csv.DictReader(f))
    per_iteration = {}
    for row in pulls:
        per_iteration.setdefault(row["iteration"], []).append(row["layer"])
    # shard 0 holds part of fc1.weight, shard 1 the rest and every other tensor: one
    # row per tensor piece, each untagged (no level), each its own part.
    assert sorted(per_iteration["3"]) == sorted(
        ["fc1.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
    assert {r["level"] for r in pulls + pushes} == {""}
    assert len({r["received_at_ns"] for r in pulls if r["iteration"] == "3"}) > 1
