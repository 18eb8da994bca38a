"""p, the fraction of a message's elements that completes it (bounded-loss) or that its
sender keeps (app-drop): checked, and turned into the parts per million the BPF
programs hold, in one place for the spec's readers, the transports and the loaders.

    fraction.check(p)                   # ValueError unless 0 < p <= 1
    fraction.ppm(0.9)                   # 900000
    fraction.threshold_elements(p, n)   # ceil(p * n) in ppm arithmetic, as XDP counts
"""

PPM = 1_000_000


def check(p: object, name: str = "p", what: str = "0.9 = deliver 90%",
          most: float = 1.0) -> float:
    """`p` as a float if it is a fraction in (0, most]; ValueError naming it otherwise."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= most:
        bound = "1" if most == 1.0 else f"p={most}"
        raise ValueError(f"{name}={p!r}: must be a fraction in (0, {bound}] ({what})")
    return float(p)


def ppm(p: float) -> int:
    """p as parts per million (0.9 -> 900000), checked to be in (0, 1]."""
    return max(1, round(check(p) * PPM))


def threshold_elements(p: float, total: int) -> int:
    """ceil(p * total), at least 1, with p in ppm: as the XDP counter, the receive ring
    and the transport's receiver compute it."""
    return max(1, (total * ppm(p) + PPM - 1) // PPM)
