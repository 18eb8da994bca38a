"""p checked and turned into ppm once (tailcut.spec.fraction), for every reader."""

import math

import pytest

from tailcut.spec import fraction


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0001, 2, True, "0.9", None, float("nan")])
def test_anything_but_a_fraction_in_0_1_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match=r"p=.*: must be a fraction in \(0, 1\]"):
        fraction.check(bad)


def test_a_bound_below_one_is_named_as_the_p_it_is() -> None:
    with pytest.raises(ValueError, match=r"min_p=0.95: must be a fraction in \(0, p=0.9\]"):
        fraction.check(0.95, "min_p", most=0.9)
    assert fraction.check(0.9, "min_p", most=0.9) == 0.9


def test_ppm_and_the_threshold_are_the_xdp_programs_arithmetic() -> None:
    assert fraction.ppm(0.9) == 900_000 and fraction.ppm(1) == 1_000_000
    assert fraction.ppm(1e-9) == 1   # never 0: a message always needs one element
    for p, total in ((0.9, 64714), (0.8, 50_000), (1.0, 7), (0.5, 1), (0.333333, 10)):
        ppm = fraction.ppm(p)
        assert fraction.threshold_elements(p, total) == max(1, math.ceil(total * ppm / 1e6))
