import pytest

from tailcut.spec import units


@pytest.mark.parametrize("text, rate", [
    ("100Mbit", 100_000_000), ("1gbit", 10**9), ("1.5Gbit", 1_500_000_000),
    (" 64 kbit ", 64_000), ("10Gbit", 10**10)])
def test_tc_style_bandwidths_parse_to_bits_per_second(text, rate):
    assert units.parse_bandwidth(text) == rate


@pytest.mark.parametrize("text, words", [
    ("10Gbps", "ambiguous"), ("10MB", "ambiguous"), ("-1", "positive"), ("0Mbit", "positive"),
    ("fast", "cannot be parsed"), ("100", "no unit"), ("5 furlongs", "unknown unit"),
    ("1bit", "outside"), ("999Tbit", "outside"), (True, "not a bandwidth")])
def test_bad_bandwidths_say_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        units.parse_bandwidth(text)


@pytest.mark.parametrize("rate", [8_000, 1_500_000, 10**9, 123_456_789])
def test_format_then_parse_is_the_identity(rate):
    assert units.parse_bandwidth(units.format_bandwidth(rate)) == rate
