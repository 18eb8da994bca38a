"""The papers' data files: each loads, and a malformed one is refused by field."""

import pytest

from tailcut import papers
from tailcut.errors import SpecError
from tailcut.training import sweep


@pytest.mark.parametrize("name", papers.NAMES)
def test_every_paper_file_loads_with_where_each_number_is_printed(name):
    paper = papers.load(name)
    assert paper.paper == name and paper.results
    for result in paper.results:
        assert result.where.strip() and result.why.strip() and result.unit.strip()


def test_a_duplicate_id_is_refused_naming_it(tmp_path):
    text = papers.path("apnet19").read_text()
    first = papers.load("apnet19").results[0].id
    bad = tmp_path / "apnet19.yaml"
    bad.write_text(text.replace("results:\n", f"results:\n  - id: {first}\n    what: x\n"
                                f"    where: y\n    paper: 1\n    unit: u\n    why: w\n", 1))
    with pytest.raises(SpecError, match=f"{first}.*appears twice"):
        papers.load("apnet19", bad)


def test_a_missing_field_is_refused_naming_the_field(tmp_path):
    bad = tmp_path / "imc20.yaml"
    bad.write_text("paper: imc20\ntitle: t\nvenue: v\nsource: s\nresults:\n"
                   "  - id: a.b\n    what: x\n    paper: 1\n    unit: u\n    why: w\n")
    with pytest.raises(SpecError, match=r"results\.0\.where"):
        papers.load("imc20", bad)


def test_the_sweep_table_takes_the_papers_bounds_from_the_data_file():
    assert sweep.paper_bound("mlp", "x1") == papers.load("apnet19").result("table3.mlp.x1").paper
    assert sweep.paper_bound("rnn", "x2") == papers.load("apnet19").result("fig2.rnn.x2").paper
    assert sweep.paper_bound("mf", "x2") == ""   # the paper prints none
