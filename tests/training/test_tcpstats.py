"""The kernel's TCP counters: parsed from /proc text, per network namespace, and
summed per job; a lossy link shows retransmissions and timeouts, a clean one none."""

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tailcut.datapath import dropper
from tailcut.runtime import procs
from tailcut.training import role, tcpstats
from tailcut.training.config import RoleConfig
from tests import netutil

REPO = Path(__file__).resolve().parents[2]

# Shortened from a 6.18 kernel's files: other tables around Tcp, MaxConn -1.
SNMP = """\
Ip: Forwarding DefaultTTL InReceives InHdrErrors
Ip: 2 64 13961 0
Icmp: InMsgs InErrors
Icmp: 1 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens OutSegs RetransSegs InErrs
Tcp: 1 200 120000 -1 34 8279 17 0
Udp: InDatagrams NoPorts
Udp: 69 0
"""
NETSTAT = """\
TcpExt: SyncookiesSent TCPFastRetrans TCPSlowStartRetrans TCPTimeouts TCPLossProbes \
TCPSpuriousRTOs TCPSynRetrans TCPOrigDataSent
TcpExt: 0 9 3 4 2 1 1 8000
IpExt: InNoRoutes InOctets
IpExt: 0 123456789012
"""
EXPECTED = {"out_segs": 8279, "retrans_segs": 17, "rto_timeouts": 4, "fast_retrans": 9,
            "slow_start_retrans": 3, "loss_probes": 2, "spurious_rtos": 1, "syn_retrans": 1}


def proc_net(tmp_path: Path, snmp: str = SNMP, netstat: str = NETSTAT) -> Path:
    (tmp_path / "snmp").write_text(snmp)
    (tmp_path / "netstat").write_text(netstat)
    return tmp_path


def test_the_counters_are_read_from_their_tables_by_name(tmp_path):
    assert tcpstats.read(proc_net(tmp_path)) == EXPECTED


def test_every_table_is_parsed_with_signed_values():
    tables = tcpstats.parse(SNMP)
    assert set(tables) == {"Ip", "Icmp", "Tcp", "Udp"}
    assert tables["Tcp"]["MaxConn"] == -1 and tables["Tcp"]["RtoMin"] == 200


def test_a_values_line_that_does_not_pair_with_its_names_is_refused_naming_the_line(tmp_path):
    short = SNMP.replace("Tcp: 1 200 120000 -1 34 8279 17 0", "Tcp: 1 200 120000 -1 34 8279")
    with pytest.raises(tcpstats.CountersError, match=r"snmp line 6: Tcp: with 7 fields"):
        tcpstats.read(proc_net(tmp_path, snmp=short))


def test_a_value_that_is_not_an_integer_is_refused_naming_the_line():
    with pytest.raises(tcpstats.CountersError, match=r"netstat line 2: invalid literal"):
        tcpstats.parse(NETSTAT.replace(" 9 3 ", " 9 x "), "/proc/net/netstat")


def test_a_counter_this_kernel_lacks_is_named_with_ours(tmp_path):
    old = NETSTAT.replace("TCPLossProbes", "TCPSomethingElse")
    with pytest.raises(tcpstats.CountersError, match="no TcpExt TCPLossProbes .for loss_probes"):
        tcpstats.read(proc_net(tmp_path, netstat=old))


def test_a_missing_proc_file_is_a_counters_error_naming_it(tmp_path):
    with pytest.raises(tcpstats.CountersError, match=f"{tmp_path}/snmp: No such file"):
        tcpstats.read(tmp_path)


def test_this_processs_namespace_has_every_counter():
    counts = tcpstats.read()
    assert set(counts) == set(tcpstats.FIELDS) and all(v >= 0 for v in counts.values())


def test_delta_is_what_was_counted_in_between():
    after = {**EXPECTED, "retrans_segs": 20, "out_segs": 9000}
    assert tcpstats.delta(EXPECTED, after) == {**{k: 0 for k in EXPECTED},
                                              "retrans_segs": 3, "out_segs": 721}


def test_a_jobs_pods_are_summed_and_one_that_wrote_nothing_is_named(tmp_path):
    tcpstats.write(tmp_path, "ps-0", EXPECTED)
    tcpstats.write(tmp_path, "worker-0", {**EXPECTED, "retrans_segs": 3})
    summary = tcpstats.summarize(tmp_path, ["ps-0", "worker-0", "worker-1"])
    assert summary["total"]["retrans_segs"] == 20
    assert summary["total"]["out_segs"] == 2 * 8279
    assert summary["missing"] == ["worker-1"] and set(summary["pods"]) == {"ps-0", "worker-0"}
    with open(tmp_path / "tcp_counters.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["pod"], r["retrans_segs"]) for r in rows] == [("ps-0", "17"), ("worker-0", "3")]
    line = tcpstats.describe(summary)
    assert line.startswith("tcp (2 pods' namespaces): 20 of 16558 segments retransmitted "
                           "(0.12%), 8 RTO timeouts, 2 SYN retransmits")
    assert line.endswith("(none from worker-1)")


def test_the_congestion_control_each_pod_used_is_recorded_and_summarized(tmp_path):
    tcpstats.write(tmp_path, "ps-0", EXPECTED, "cubic")
    tcpstats.write(tmp_path, "worker-0", EXPECTED, "cubic")
    summary = tcpstats.summarize(tmp_path, ["ps-0", "worker-0"])
    assert summary["congestion_control"] == ["cubic"]
    assert tcpstats.describe(summary).endswith("; congestion control cubic")


def test_a_pods_file_without_every_counter_counts_as_missing(tmp_path):
    tcpstats.write(tmp_path, "ps-0", EXPECTED)
    (tmp_path / "tcp-worker-0.json").write_text('{"out_segs": 5}')
    summary = tcpstats.summarize(tmp_path, ["ps-0", "worker-0"])
    assert list(summary["pods"]) == ["ps-0"] and summary["missing"] == ["worker-0"]


def test_a_job_with_no_counters_says_so(tmp_path):
    summary = tcpstats.summarize(tmp_path, ["ps-0"])
    assert summary["total"]["retrans_segs"] == 0 and summary["missing"] == ["ps-0"]
    assert tcpstats.describe(summary) == "tcp: no pod reported its TCP counters"


def _config(tmp_path: Path, role_name: str, index: int) -> RoleConfig:
    return RoleConfig(job="tcpstats", role=role_name, index=index, ps_host="127.0.0.1",
                      ps_port=1, num_workers=2, results_dir=str(tmp_path / "results"))


def test_a_roles_closing_event_carries_its_counters_and_leaves_them_in_a_file(tmp_path):
    events: list[dict] = []
    emit = role._with_tcp_counters(_config(tmp_path, "worker", 1), events.append)
    emit({"event": "start"})
    emit({"event": "worker_done", "index": 1})
    assert events[0] == {"event": "start"}
    assert set(events[1]["tcp"]) == set(tcpstats.FIELDS)
    written = json.loads((tmp_path / "results" / "tcp-worker-1.json").read_text())
    assert written == {**events[1]["tcp"],
                       "congestion_control": tcpstats.default_congestion_control()}
    assert written["congestion_control"]  # this namespace's default, e.g. bbr


def test_unreadable_counters_leave_the_events_as_they_are(tmp_path, monkeypatch, capsys):
    def unreadable(*_: object) -> dict:
        raise tcpstats.CountersError("/proc/net/snmp: Permission denied")

    monkeypatch.setattr(tcpstats, "read", unreadable)
    events: list[dict] = []
    role._with_tcp_counters(_config(tmp_path, "ps", 0), events.append)({"event": "done"})
    assert events == [{"event": "done"}]
    assert not (tmp_path / "results").exists()
    assert "tailcut ps-0: TCP counters not recorded: /proc/net/snmp" in capsys.readouterr().err


# --- real namespaces: a TCP transfer over a veth, with the eBPF dropper's loss --------
# The dropper sits on the receiver's ingress or on the sender's own egress: either way
# lost in the network, as far as the sender knows (at egress it steals the packet
# rather than shooting it, which TCP would hear of as a local drop).
SENDER_IP, RECEIVER_IP, PORT = "10.98.0.1", "10.98.0.2", 5301
# Paced (~60 Mbit/s: the host is shared) until the stop file appears, so the flow
# outlasts however long the dropper takes to compile.
PACED_SENDER = """
import os, socket, time
s = socket.create_connection(("{ip}", {port}), timeout=10)
buf = b"x" * 16384
while not os.path.exists("{stop}"):
    s.sendall(buf)
    time.sleep(0.002)
s.close()
"""
RECEIVER = """
import socket
srv = socket.socket(); srv.bind(("0.0.0.0", {port})); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept(); total = 0
print("connected", flush=True)
while data := conn.recv(1 << 20):
    total += len(data)
print(total)
"""


def counters_in(ns: str) -> tcpstats.Counts:
    """tcpstats.read() as a role calls it: in a process inside namespace `ns`."""
    code = "import json; from tailcut.training import tcpstats; print(json.dumps(tcpstats.read()))"
    proc = procs.spawn(ns, [sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env={"PYTHONPATH": str(REPO)})
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    return dict(json.loads(out))


def transfer(sender: str, receiver: str, tmp_path: Path, seconds: float,
             meanwhile: Callable[[], None] = lambda: None) -> tuple[tcpstats.Counts, ...]:
    """What one TCP connection from `sender` to `receiver` counted in each namespace:
    paced for `seconds` after `meanwhile()` returned. Also checks that data arrived."""
    before = counters_in(sender), counters_in(receiver)
    stop = tmp_path / "stop"
    stop.unlink(missing_ok=True)
    rx = netutil.start(receiver, RECEIVER.format(port=PORT))
    assert rx.stdout.readline().strip() == b"ready", rx.stderr.read().decode()
    tx = netutil.start(sender, PACED_SENDER.format(ip=RECEIVER_IP, port=PORT, stop=stop))
    try:   # from here (a lost SYN waits 1 s): `seconds` of data
        assert rx.stdout.readline().strip() == b"connected", rx.stderr.read().decode()
        meanwhile()
        time.sleep(seconds)
        stop.touch()
        _, err = tx.communicate(timeout=60)
        assert tx.returncode == 0, err.decode()
        out, err = rx.communicate(timeout=60)
        assert rx.returncode == 0 and int(out) > 0, err.decode()
    finally:
        for proc in (tx, rx):
            procs.stop(proc)
    return (tcpstats.delta(before[0], counters_in(sender)),
            tcpstats.delta(before[1], counters_in(receiver)))


@pytest.fixture
def link() -> Iterator[tuple[str, str]]:
    names = (f"tailcut-tcpstats-{os.getpid()}.tx", f"tailcut-tcpstats-{os.getpid()}.rx")
    with netutil.linked_namespaces(names, (SENDER_IP, RECEIVER_IP)):
        yield names


@pytest.mark.netns
def test_a_clean_link_retransmits_nothing(link, tmp_path):
    sent, received = transfer(*link, tmp_path, seconds=1.0)
    print(f"clean: sender {sent}, receiver {received}")
    assert sent["out_segs"] > 100   # the sender's own namespace counted the transfer
    assert sent["retrans_segs"] == 0 and sent["rto_timeouts"] == 0
    assert received["retrans_segs"] == 0


@pytest.mark.netns
@pytest.mark.bpf
@pytest.mark.parametrize("at", ["receiver's ingress", "sender's egress"])
def test_a_lossy_link_shows_retransmissions_in_the_senders_namespace_only(link, tmp_path, at):
    ns, direction = (link[1], "ingress") if at == "receiver's ingress" else (link[0], "egress")
    with dropper.attach(ns, "lan0", 0.05, direction=direction) as drops:
        sent, received = transfer(*link, tmp_path, seconds=1.0)
        dropped = drops.counts()[1]
    print(f"5% loss: {dropped} packets dropped; sender {sent}, receiver {received}")
    assert dropped > 0
    assert 0 < sent["retrans_segs"] < sent["out_segs"]
    # Per namespace: the receiver sent ACKs only, never retransmitted; at most its
    # FIN, when the sender's ACK of it was the packet lost
    assert received["retrans_segs"] <= 1


@pytest.mark.netns
@pytest.mark.bpf
def test_a_blackout_longer_than_the_minimum_rto_makes_tcp_wait_for_its_timer(link, tmp_path):
    """As in incast: a whole window lost, no duplicate ACK comes back, only the
    retransmission timer (200 ms at least) restarts the flow."""
    def blackout() -> None:
        time.sleep(0.3)
        with dropper.attach(link[1], "lan0", 1.0, direction="ingress"):
            time.sleep(0.6)

    sent, _ = transfer(*link, tmp_path, seconds=1.0, meanwhile=blackout)
    print(f"0.6 s blackout: sender {sent}")
    assert sent["rto_timeouts"] >= 1 and sent["retrans_segs"] >= 1
