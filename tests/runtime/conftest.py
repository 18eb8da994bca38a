import pytest

from tailcut.runtime import local
from tests.runtime import runs


@pytest.fixture(autouse=True)
def _note_programs_before():
    runs.note_programs_before()


@pytest.fixture(scope="session")
def sparse_ps_alone(tmp_path_factory):
    """(result, results dir) of the in-network examples' sparse job with no in-network
    help: the PS alone that ToR aggregation, multicast and both with the hot store are
    each compared with (tests/runtime/test_in_network_{aggregation,multicast}.py). The
    two examples differ only in their inNetwork section, which this run drops: one run
    serves them all, where each test ran its own."""
    runs.note_programs_before()
    results = tmp_path_factory.mktemp("innet-alone")
    result = local.run(runs.sparse_job("in-network-aggregation.yaml", "innet-alone", None),
                       results, progress=lambda line: None)
    assert result.iterations == runs.SPARSE_ITERATIONS
    runs.nothing_of("innet-alone")
    return result, results
