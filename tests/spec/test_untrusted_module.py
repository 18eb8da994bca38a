"""A spec read by the operator or the node agent names a tenant's module: its form is
checked there, and nothing of it is imported (it runs in the job's own pods)."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError


def _job(module: str) -> dict[str, object]:
    return {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "t"},
            "spec": {"training": {"model": "torch", "module": module}}}


def test_a_module_is_not_imported_where_modules_are_not_imported(tmp_path):
    marker = tmp_path / "imported"
    tenant = tmp_path / "tenant.py"
    tenant.write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                      "def build(seed):\n    raise SystemExit(1)\n")
    job = spec.from_dict(_job(f"{tenant}:build"), import_modules=False)
    assert job.spec.training.module == f"{tenant}:build"
    assert not marker.exists()
    # a module path the operator cannot see is kept as written: the pods resolve it
    job = spec.from_dict(_job("models/net.py:build"), import_modules=False)
    assert job.spec.training.module == "models/net.py:build"


@pytest.mark.parametrize("module", ["no-colon", ":build", "pkg.mod:", "pkg.mod:not-a-name"])
def test_a_module_of_the_wrong_form_is_refused_without_importing(module):
    with pytest.raises(SpecError) as err:
        spec.from_dict(_job(module), import_modules=False)
    assert "spec.training.module" in str(err.value)
    assert 'must be "package.module:factory"' in str(err.value)
