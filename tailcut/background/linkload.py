"""Measure the load on one link direction from its interface's counters.

A thread samples the transmitting veth's netlink statistics (IFLA_STATS64 tx_bytes)
and, for comparison, the byte counter of its HTB root qdisc (which counts every TCP/IP
header of a GSO super-packet, as the shaper does). The load factor of an interval is
bytes * 8 / (bandwidth * seconds)."""

import csv
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tailcut.net import netns

FIELDS = ("t_s", "tx_bytes", "tx_packets", "htb_bytes", "load_factor", "load_factor_htb")


class LinkLoad:
    """Samples one interface every `interval_s` into a CSV until stopped."""

    def __init__(self, namespace: str, ifname: str, bandwidth_bit: int, csv_path: Path,
                 interval_s: float = 0.5) -> None:
        self.namespace, self.ifname = namespace, ifname
        self.bandwidth_bit = bandwidth_bit
        self.csv_path, self.interval_s = csv_path, interval_s
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.t0 = time.monotonic()

    def start(self) -> None:
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"linkload {self.ifname}")
        self._thread.start()
        self._ready.wait(5)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._write()

    def _loop(self) -> None:
        # pyroute2's socket belongs to the thread that made it (used from another
        # thread it silently reads the host's namespace), so this thread owns it.
        try:
            self._ipr = netns.ipr(self.namespace)
            self._index = self._ipr.link_lookup(ifname=self.ifname)[0]
            self.t0 = time.monotonic()
            self._sample()
        except BaseException as err:
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
            self._sample()
        except Exception:
            pass  # the link went away with the network: keep what was sampled
        finally:
            self._ipr.close()

    def _sample(self) -> None:
        link = self._ipr.get_links(self._index)[0]
        stats = link.get_attr("IFLA_STATS64")
        htb = 0
        for qdisc in self._ipr.get_qdiscs(index=self._index):
            if qdisc.get_attr("TCA_KIND") == "htb" and qdisc["parent"] == 0xFFFFFFFF:
                basic = qdisc.get_nested("TCA_STATS2", "TCA_STATS_BASIC")
                htb = int(basic["bytes"]) if basic else 0
        self.samples.append((time.monotonic() - self.t0, int(stats["tx_bytes"]),
                             int(stats["tx_packets"]), htb))

    def load_factor(self, from_s: float = 0.0, to_s: Optional[float] = None,
                    htb: bool = False) -> Optional[float]:
        """Mean load factor over the samples in [from_s, to_s]."""
        window = [s for s in self.samples
                  if s[0] >= from_s and (to_s is None or s[0] <= to_s)]
        if len(window) < 2 or window[-1][0] <= window[0][0]:
            return None
        col = 3 if htb else 1
        return ((window[-1][col] - window[0][col]) * 8
                / (self.bandwidth_bit * (window[-1][0] - window[0][0])))

    def _write(self) -> None:
        rows: list[dict[str, Any]] = []
        for prev, cur in zip(self.samples, self.samples[1:]):
            dt = cur[0] - prev[0] or 1e-9
            rows.append({"t_s": f"{cur[0]:.3f}", "tx_bytes": cur[1], "tx_packets": cur[2],
                         "htb_bytes": cur[3],
                         "load_factor": f"{(cur[1] - prev[1]) * 8 / self.bandwidth_bit / dt:.4f}",
                         "load_factor_htb":
                             f"{(cur[3] - prev[3]) * 8 / self.bandwidth_bit / dt:.4f}"})
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
