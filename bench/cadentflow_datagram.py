"""CadentFlow over the bounded-loss transport: when the most urgent tensor of a message
is usable, and how much of each tensor arrives, with tags vs without, side by side.

    sudo .venv/bin/python bench/cadentflow_datagram.py [--rounds 5] [--messages 5]

One veth pair between two namespaces; the sender's egress is shaped by HTB (--rate)
with 4 priority classes. Two bounded-loss senders in the sender namespace (two
"workers") each push a deep-mlp-sized gradient (316,714 floats, its 8 tensors) to one
receiver (the "PS") at the same moment, --messages times per mode and round:

  fair        untagged whole messages, random slot order over the whole message; a
              tensor is usable when its message is (as flows.rows counts it)
  order only  cut per tensor and sent most urgent first, each with its DSCP, but no
              classifier: every packet in the default class (the sender's order alone)
  cadentflow  the same, with the DSCP classifier: each level in its HTB class

Each sender paces at the link's rate (the transport's default), so the two together
offer twice what the link carries, and bounded-loss stops at p of each message.
Prints, medians over all messages then over rounds: fc1.weight's completion (level
0), the message's, and the fraction of each tensor delivered.

    sudo .venv/bin/python bench/cadentflow_datagram.py --training-rounds 3 [--iterations 70]

runs examples/cadentflow-bounded-loss.yaml (capped at --iterations) with policy fair
and cadentflow, alternating, and prints iteration time, final test accuracy and loss,
and the per-tensor pull completion times of each (medians of the rounds), each run's
fidelity verdict, and the cadentflow / fair ratios marked with both (bench/README.md).
Either way it refuses a busy host unless --allow-busy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut import transports  # noqa: E402
from tailcut.datapath import classifier  # noqa: E402
from tailcut.net import netns, shaping, tc  # noqa: E402
from tailcut.spec import units  # noqa: E402
from tailcut.spec.model import Link  # noqa: E402
from tailcut.ml import deep_mlp  # noqa: E402
from tailcut.training import flows  # noqa: E402
from tailcut.transports.base import Kind, Message  # noqa: E402
from tests.datapath import udp_link  # noqa: E402  (the two-namespace link of the tests)

MODES = ("fair", "order only", "cadentflow")
SENDERS = 2


def _layers() -> list[Any]:
    return list(deep_mlp.DeepMLP(1000, 10).layers)  # the deep-mlp of `tailcut models`


@contextmanager
def _endpoints(link: udp_link.Link, port: int, p: float) -> Iterator[tuple[Any, list, list]]:
    """A receiving transport with SENDERS connections, and SENDERS sending transports."""
    server = transports.get("bounded-loss", p=p, job="dg-bench")
    # The senders share one interface and receive nothing: no XDP counter on their side.
    clients = [transports.get("bounded-loss", p=p, job="dg-bench", xdp=False)
               for _ in range(SENDERS)]
    got: dict[str, Any] = {}

    def listen() -> None:
        with netns.entered(link.receiver):
            got["conns"] = server.listen(udp_link.RECEIVER_IP, port, SENDERS, 20)

    t = threading.Thread(target=listen)
    t.start()
    conns = []
    try:
        for c in clients:
            with netns.entered(link.sender):
                conns.append(c.connect(udp_link.RECEIVER_IP, port, 20))
    finally:
        t.join()
    try:
        yield server, got["conns"], conns
    finally:
        for conn in conns + got.get("conns", []):
            conn.close()
        for tr in clients + [server]:
            tr.close()


def _one_mode(link: udp_link.Link, mode: str, port: int, p: float, messages: int,
              layers: list[Any], levels: dict[str, int], control_untagged: bool,
              stagger_s: float) -> list[dict[str, Any]]:
    """Per message received: fc1.weight's and the message's completion, and the
    delivered fraction of each tensor."""
    size = sum(layer.size for layer in layers)
    cuts = flows.cuts(layers, 0, size, levels)
    rng = np.random.default_rng(port)
    out = []
    attached = classifier.attach(link.sender, udp_link.IFNAME) if mode == "cadentflow" \
        else nullcontext()
    with attached, _endpoints(link, port, p) as (server, inbound, outbound):
        if mode != "fair":
            for conn in outbound:
                flows.tag(conn, Kind.PUSH, cuts)  # control frames at level 0, as in a run
                if control_untagged:
                    conn.control_tos = 0  # BEGIN/END in the default class, behind the data
        for i in range(messages):
            vectors = [rng.standard_normal(size).astype(np.float32) for _ in outbound]
            def push(w: int) -> None:
                time.sleep(w * stagger_s)  # the later sender joins mid-message
                outbound[w].send(Message(Kind.PUSH, i, w, vectors[w]), 30)

            threads = [threading.Thread(target=push, args=(w,)) for w in range(len(outbound))]
            for t in threads:
                t.start()
            got = [conn.recv(30) for conn in inbound]
            for t in threads:
                t.join()
            for msg in got:
                ok = np.ones(size, bool) if msg.mask is None else msg.mask
                parts = {part.offset: part for part in msg.parts or []}
                row = {"message_ms": msg.completion_s * 1e3, "sender": msg.sender}
                for layer in layers:
                    part = parts.get(layer.offset)
                    row[f"{layer.name} ms"] = (part.completion_s if part else
                                               msg.completion_s) * 1e3
                    row[layer.name] = float(ok[layer.offset:layer.offset + layer.size].mean())
                out.append(row)
        # Per message: NACKs the receiver sent and packets the senders retransmitted.
        nacks = server.stats["nacks"] / len(out)
        retx = sum(conn.transport.stats["retransmitted"] for conn in outbound) / len(out)
    for row in out:
        row["nacks"], row["retransmitted"] = nacks, retx
    return out


def training_rounds(rounds: int, iterations: int) -> None:
    """Real `tailcut run` jobs over bounded-loss, fair vs cadentflow, side by side."""
    import json
    import tempfile

    import yaml

    from tailcut import spec
    from tailcut.runtime import local

    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" /
                           "cadentflow-bounded-loss.yaml").read_text())
    policies = ("fair", "cadentflow")
    got: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp:
        for r in range(rounds):
            for policy in policies if r % 2 == 0 else policies[::-1]:
                raw = json.loads(json.dumps(base))
                raw["metadata"]["name"] = f"dg-bench-{policy[:4]}"
                raw["spec"]["training"].update(iterations=iterations, targetAccuracy=None,
                                               epochs=1000)
                raw["spec"]["scheduling"]["policy"] = policy
                out = Path(tmp) / f"{policy}-{r}"
                result = local.run(spec.from_dict(raw), out, progress=lambda _: None)
                flows_json = json.loads((out / "flows.json").read_text())
                got[policy].append({"iteration_ms": flows_json["iteration_s"] * 1e3,
                                    "accuracy": result.final_accuracy,
                                    "loss": result.final_loss,
                                    "pull": {k: v["median"] * 1e3 for k, v in
                                             flows_json["fct_s"]["pull"].items()},
                                    "verdict": hostcheck.verdict_of(result.fidelity)})
                print(f"round {r} {policy:>10}: iteration {got[policy][-1]['iteration_ms']:.1f}"
                      f" ms, accuracy {result.final_accuracy:.3f}, loss "
                      f"{result.final_loss:.4f}; {hostcheck.during(result.fidelity)}",
                      flush=True)
    print(f"\nexamples/cadentflow-bounded-loss.yaml, {iterations} iterations; medians of "
          f"{rounds} rounds")
    print(f"{'':>10} {'iteration ms':>13} {'accuracy':>9} {'loss':>8}")
    for policy in policies:
        rows = got[policy]
        print(f"{policy:>10} {statistics.median(r['iteration_ms'] for r in rows):>13.1f} "
              f"{statistics.median(r['accuracy'] for r in rows):>9.3f} "
              f"{statistics.median(r['loss'] for r in rows):>8.4f}")
    marked = hostcheck.mark({p: [r["verdict"] for r in got[p]] for p in policies})
    print(f"\npull FCT ms per tensor (ratio cadentflow / fair: {marked}):")
    for name in got["fair"][0]["pull"]:
        f = statistics.median(r["pull"][name] for r in got["fair"])
        c = statistics.median(r["pull"][name] for r in got["cadentflow"])
        print(f"{name:>12} fair {f:8.1f}  cadentflow {c:8.1f}  ratio {c / f:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--rate", default="100Mbit")
    parser.add_argument("--p", type=float, default=0.9)
    parser.add_argument("--stagger-ms", type=float, default=0.0,
                        help="start the second sender this much after the first")
    parser.add_argument("--training-rounds", type=int, default=0,
                        help="run real jobs instead (examples/cadentflow-bounded-loss.yaml)")
    parser.add_argument("--iterations", type=int, default=70)
    parser.add_argument("--control-untagged", action="store_true",
                        help="leave the control channel in the default class (the "
                             "lowest): shows why a run tags it at level 0")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 2
    watch = hostcheck.before(args)
    if args.training_rounds:
        training_rounds(args.training_rounds, args.iterations)
        hostcheck.after(watch)
        return 0
    layers = _layers()
    levels = {layer.name: min(i // 2, 3) for i, layer in enumerate(layers)}
    rate = units.parse_bandwidth(args.rate)
    link = udp_link.build_link("dgb")
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        with netns.ipr(link.sender) as ipr:
            tc.apply(shaping.plan(Link(bandwidth=args.rate), False, "bench"), ipr,
                          link.sender, udp_link.IFNAME)
            tc.apply_priorities(shaping.plan_priorities(rate, 4), ipr, udp_link.IFNAME)
        for r in range(args.rounds):
            for k, mode in enumerate(MODES):
                rows = _one_mode(link, mode, 47600 + 10 * r + k, args.p, args.messages,
                                 layers, levels, args.control_untagged,
                                 args.stagger_ms / 1e3)
                med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
                med["late fc1 ms"] = statistics.median(
                    row["fc1.weight ms"] for row in rows if row["sender"] == SENDERS - 1)
                rounds[mode].append(med)
                print(f"round {r} {mode:>10}: fc1.weight {med['fc1.weight ms']:.1f} ms, "
                      f"message {med['message_ms']:.1f} ms", flush=True)
    finally:
        udp_link.remove_link(link)

    def median(mode: str, key: str) -> float:
        return statistics.median(row[key] for row in rounds[mode])

    print(f"\nbounded-loss p={args.p}, {SENDERS} senders at once on one {args.rate} HTB egress, "
          f"deep-mlp gradients ({sum(layer.size for layer in layers)} floats); medians of "
          f"{args.messages} messages x {SENDERS} senders, then of {args.rounds} rounds"
          + ("; control channel untagged" if args.control_untagged else "")
          + (f"; the second sender starts {args.stagger_ms:g} ms after the first"
             if args.stagger_ms else ""))
    print(f"{'':>12} {'fc1.weight ms':>14} {'fc1 / fair':>11} {'2nd sender fc1':>15} "
          f"{'/ fair':>7} {'message ms':>11}")
    for mode in MODES:
        fc1, late = median(mode, "fc1.weight ms"), median(mode, "late fc1 ms")
        print(f"{mode:>12} {fc1:>14.1f} {fc1 / median('fair', 'fc1.weight ms'):>11.3f} "
              f"{late:>15.1f} {late / median('fair', 'late fc1 ms'):>7.3f} "
              f"{median(mode, 'message_ms'):>11.1f}")
    print(f"\n{'':>12} {'NACKs':>7} {'retransmitted packets':>22}   (per message)")
    for mode in MODES:
        print(f"{mode:>12} {median(mode, 'nacks'):>7.2f} {median(mode, 'retransmitted'):>22.1f}")
    print("\ncompletion ms per tensor (level):")
    print(f"{'tensor':>12} {'level':>5} " + " ".join(f"{m:>11}" for m in MODES))
    for layer in layers:
        print(f"{layer.name:>12} {levels[layer.name]:>5} "
              + " ".join(f"{median(m, layer.name + ' ms'):>11.1f}" for m in MODES))
    print("\ndelivered fraction per tensor:")
    print(f"{'tensor':>12} {'level':>5} " + " ".join(f"{m:>11}" for m in MODES))
    for layer in layers:
        print(f"{layer.name:>12} {levels[layer.name]:>5} "
              + " ".join(f"{median(m, layer.name):>11.3f}" for m in MODES))
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
