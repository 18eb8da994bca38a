"""Each paper's headlines: judged on its result, reproduced only in the paper's
direction by half its size and, for testbed runs, from network-bound runs."""

import pytest

from tailcut import papers
from tailcut.errors import SpecError
from tailcut.reproduce import report
from tailcut.reproduce.measure import Measured, Value


def test_a_speedup_is_judged_by_how_far_it_is_from_one():
    judge = report.judge_headline
    assert judge("speedup", 2.2, 1.7, True, "6 network-bound")[0] == report.REPRODUCED
    # half of 2.2's 1.2 is 0.6: 1.5 falls short, 0.9 goes the other way
    assert judge("speedup", 2.2, 1.5, True, "6 network-bound")[0] == report.NOT_REPRODUCED
    assert judge("speedup", 1.1, 0.9, False, "")[0] == report.NOT_REPRODUCED
    assert judge("speedup", 1.1, None, False, "")[0] == report.NOT_MEASURED


def test_an_amount_needs_half_the_papers():
    assert report.judge_headline("amount", 0.25, 0.13, False, "")[0] == report.REPRODUCED
    assert report.judge_headline("amount", 0.25, 0.077, False, "")[0] == \
        report.NOT_REPRODUCED


def test_a_testbed_headline_counts_only_from_network_bound_runs():
    status, why = report.judge_headline("speedup", 1.1, 1.5, True,
                                        "2 host-bound, 4 network-bound")
    assert status == report.NOT_REPRODUCED
    assert "not all network-bound (2 host-bound, 4 network-bound)" in why
    assert report.judge_headline("speedup", 1.1, 1.5, True, "")[0] == report.NOT_REPRODUCED


def test_every_paper_has_a_headline_and_the_report_ends_with_their_table():
    for name in papers.NAMES:
        paper = papers.load(name)
        assert paper.headlines, name
        claims = report.headlines(paper, Measured())
        assert [c["status"] for c in claims] == [report.NOT_MEASURED] * len(claims)
    paper = papers.load("apnet19")
    measured = Measured(values={"speedup.congestion.min": Value(
        1.47, "steps/...", "one MLP pair at 200 Mbit/s", "6 network-bound")})
    (claim,) = report.headlines(paper, measured)
    assert claim["status"] == report.REPRODUCED and claim["verdicts"] == "6 network-bound"
    text = report.headlines_markdown([claim])
    assert text.splitlines()[1] == "## Headlines" and "**reproduced**" in text


def test_a_headline_must_name_a_result(tmp_path):
    source = tmp_path / "apnet19.yaml"
    source.write_text(papers.path("apnet19").read_text().replace(
        "  - id: speedup.congestion.min\n    claim:", "  - id: speedup.nowhere\n    claim:"))
    with pytest.raises(SpecError, match="names no result"):
        papers.load("apnet19", source)
