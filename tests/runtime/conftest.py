import pytest

from tests.runtime import runs


@pytest.fixture(autouse=True)
def _note_programs_before():
    runs.note_programs_before()
