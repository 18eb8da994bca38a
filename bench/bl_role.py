"""A bench role run inside a pod: `python bench/bl_role.py CONFIG_JSON`.

ps:     accept `workers` connections; each round send a HELLO ("go") to every worker
        and gather one PUSH from each; print per-message completion and delivery.
worker: connect; answer every go with a PUSH of `elements` float32s; exit at STOP.
sender / receiver: one-to-one rounds (goodput and p-to-app latency)."""

import json
import resource
import sys
import time

import numpy as np

from tailcut import transports
from tailcut.transports.base import Kind, Message


def _cpu_s() -> float:
    """CPU time of this role so far, user and system (the kernel's work on the path
    is mostly done in the sending and receiving threads' own context)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    cfg = json.loads(sys.argv[1])
    t = transports.get(cfg["transport"], **cfg.get("options", {}))
    if cfg["role"] == "ps":
        conns = t.listen(cfg["host"], cfg["port"], cfg["workers"], 60)
        cpu_at_start = _cpu_s()
        hellos = t.gather(conns, 60)
        conns = [c for _, c in sorted(zip([h.sender for h in hellos], conns))]
        rows = []
        for r in range(cfg["rounds"]):
            for c in conns:
                c.send(Message(Kind.HELLO, r, -1), 30)
            for m in t.gather(conns, 60):
                got = m.values.size if m.mask is None else int(m.mask.sum())
                rows.append({"round": r, "sender": m.sender, "completion_s": m.completion_s,
                             "delivered": got / m.values.size, "bytes": m.wire_bytes,
                             "elements": got, "sent_ns": m.sent_at_ns,
                             "received_ns": m.received_at_ns})
        for c in conns:
            c.send(Message(Kind.STOP, cfg["rounds"], -1), 30)
        records = list(getattr(t, "completions", []))
        stats = dict(getattr(t, "stats", {}))
        time.sleep(0.2)
        for c in conns:
            c.close()
        t.close()
        print(json.dumps({"messages": rows, "records": records, "stats": stats,
                          "cpu_s": _cpu_s() - cpu_at_start}))
    elif cfg["role"] == "worker":
        c = t.connect(cfg["host"], cfg["port"], 60)
        c.send(Message(Kind.HELLO, 0, cfg["index"]), 30)
        v = np.random.default_rng(cfg["index"]).standard_normal(cfg["elements"]).astype(
            np.float32)
        cpu_at_start = _cpu_s()
        while True:
            go = c.recv(120)
            if go.kind == Kind.STOP:
                break
            c.send(Message(Kind.PUSH, go.iteration, cfg["index"], v), 60)
        c.close()
        t.close()
        print(json.dumps({"ok": True, "cpu_s": _cpu_s() - cpu_at_start}))


if __name__ == "__main__":
    main()
