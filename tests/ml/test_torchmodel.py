"""PyTorch models as tailcut models: the built-in twins match the numpy models, a user's
module trains, and what cannot load is refused naming the field and the error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tailcut import spec
from tailcut.errors import SpecError
from tailcut.ml import models, torchmodel
from tailcut.ml.models import views

pytestmark = pytest.mark.skipif(not torchmodel.available(),
                                reason="PyTorch is not installed (scripts/setup.sh)")

# float32 arithmetic in a different order (BLAS vs torch's kernels): over 200 SGD
# steps the losses stay within this (the largest gap measured was 5e-7), where a
# one-element slip in the layout or a missed transpose puts them 0.1 or more apart.
LOSS_TOLERANCE = 1e-4


def _torch_layout(numpy_model: models.Model, flat: np.ndarray) -> np.ndarray:
    """A numpy dense model's vector in torch's layout (Linear weights transposed)."""
    parts = [(v.T if layer.name.startswith("fc") and layer.name.endswith("weight") else v)
             .reshape(-1) for layer, v in zip(numpy_model.layers,
                                              views(numpy_model.layers, flat))]
    return np.concatenate(parts)


def _job(training: dict[str, object], **rest: object) -> dict[str, object]:
    return {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "t"}, "spec": {"training": training, **rest}}


def test_torch_mlp_and_numpy_mlp_from_the_same_start_follow_the_same_loss_curve():
    d_np, d_t = models.dataset("mlp", 0), models.dataset("torch-mlp", 0)
    assert np.array_equal(d_np.x_train, d_t.x_train)
    m_np, m_t = models.create("mlp", d_np), models.create("torch-mlp", d_t)
    p_np = m_np.init_params(np.random.default_rng(0))
    p_t = m_t.init_params(np.random.default_rng(0))
    assert np.array_equal(_torch_layout(m_np, p_np), p_t)   # the same initial parameters
    rng = np.random.default_rng(1)
    gaps = []
    for _ in range(200):
        rows = rng.choice(len(d_np.x_train), 32, replace=False)
        loss_np, g_np = m_np.loss_and_grad(p_np, d_np.x_train[rows], d_np.y_train[rows])
        loss_t, g_t = m_t.loss_and_grad(p_t, d_t.x_train[rows], d_t.y_train[rows])
        gaps.append(abs(loss_np - loss_t))
        p_np -= 0.3 * g_np
        p_t -= 0.3 * g_t
    assert max(gaps) < LOSS_TOLERANCE, max(gaps)
    assert loss_np < 2.0   # and it did learn: log(10) = 2.30 at the start
    acc_np = m_np.evaluate(p_np, d_np.x_test, d_np.y_test)[1]
    acc_t = m_t.evaluate(p_t, d_t.x_test, d_t.y_test)[1]
    assert abs(acc_np - acc_t) <= 0.002


def test_torch_cnn_starts_where_the_numpy_cnn_does_with_the_same_gradient():
    d_np, d_t = models.dataset("cnn", 0), models.dataset("torch-cnn", 0)
    m_np, m_t = models.create("cnn", d_np), models.create("torch-cnn", d_t)
    p_np = m_np.init_params(np.random.default_rng(0))
    p_t = m_t.init_params(np.random.default_rng(0))
    assert [layer.shape for layer in m_t.layers][0] == (8, 1, 3, 3)
    assert np.array_equal(_torch_layout(m_np, p_np), p_t)
    x, y = d_np.x_train[:32], d_np.y_train[:32]
    loss_np, g_np = m_np.loss_and_grad(p_np, x, y)
    loss_t, g_t = m_t.loss_and_grad(p_t, x, y)
    assert loss_t == pytest.approx(loss_np, abs=1e-5)
    np.testing.assert_allclose(g_t, _torch_layout(m_np, g_np), atol=1e-5)


def test_torch_model_cuts_one_layer_per_parameter_tensor():
    m = models.create("torch-mlp", models.dataset("torch-mlp", 0))
    assert [(layer.name, layer.offset) for layer in m.layers] == [
        ("fc1.weight", 0), ("fc1.bias", 64000), ("fc2.weight", 64064), ("fc2.bias", 64704)]
    assert m.num_params == 64714


USER_MODULE = """
import numpy as np
import torch

def build(seed):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (3, 5)).astype(np.float32)
    y = rng.integers(0, 3, 600)
    x = (centres[y] + rng.normal(0, 0.3, (600, 5))).astype(np.float32)
    module = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(),
                                 torch.nn.Linear(16, 3))
    return module, torch.nn.CrossEntropyLoss(), (x[:500], y[:500], x[500:], y[500:])
"""


def test_a_user_module_given_by_path_trains(tmp_path):
    path = tmp_path / "usermodel.py"
    path.write_text(USER_MODULE)
    job = spec.from_dict(_job({"model": "torch", "module": f"{path}:build"}))
    ref = job.spec.training.model_ref
    assert ref == f"torch:{path}:build"
    d = models.dataset(ref, 0)
    m = models.create(ref, d)
    params = m.init_params(np.random.default_rng(0))
    before = m.evaluate(params, d.x_test, d.y_test)
    rng = np.random.default_rng(0)
    for _ in range(150):
        rows = rng.choice(len(d.x_train), 20, replace=False)
        _, grad = m.loss_and_grad(params, d.x_train[rows], d.y_train[rows])
        params -= 0.2 * grad
    after = m.evaluate(params, d.x_test, d.y_test)
    assert after[0] < before[0] / 2
    assert after[1] > 0.9
    # The same seed makes the same model on another host (here: a second build).
    again = models.create(ref, models.dataset(ref, 0))
    assert np.array_equal(again.init_params(np.random.default_rng(5)),
                          m.init_params(np.random.default_rng(5)))


def test_a_relative_module_path_is_made_absolute_for_the_roles(tmp_path, monkeypatch):
    (tmp_path / "usermodel.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    job = spec.from_dict(_job({"model": "torch", "module": "usermodel.py:build"}))
    assert job.spec.training.module == f"{tmp_path}/usermodel.py:build"


def test_a_module_that_fails_to_import_is_refused_naming_the_field_and_the_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import torch\nimport no_such_package_here\n")
    with pytest.raises(SpecError) as err:
        spec.from_dict(_job({"model": "torch", "module": f"{path}:build"}))
    text = str(err.value)
    assert "spec.training.module" in text
    assert "ModuleNotFoundError: No module named 'no_such_package_here'" in text


@pytest.mark.parametrize("module, says", [
    ("tailcut.ml.torchzoo:nothing", "has no callable 'nothing'"),
    ("no-colon", 'must be "package.module:factory"'),
    ("missing/file.py:build", "no file"),
])
def test_a_module_without_its_factory_is_refused_naming_the_field(module, says):
    with pytest.raises(SpecError) as err:
        spec.from_dict(_job({"model": "torch", "module": module}))
    assert "spec.training.module" in str(err.value) and says in str(err.value)


def test_model_torch_needs_a_module_and_only_it_takes_one():
    with pytest.raises(SpecError, match="module: model torch needs module"):
        spec.from_dict(_job({"model": "torch"}))
    with pytest.raises(SpecError, match="only model torch takes a module"):
        spec.from_dict(_job({"model": "mlp", "module": "tailcut.ml.torchzoo:mlp"}))


def test_a_factory_that_breaks_the_contract_is_refused_naming_what_it_returned(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def build(seed):\n    return 1, 2\n")
    with pytest.raises(torchmodel.ModuleError, match="must return \\(module, loss, data\\)"):
        models.dataset(f"torch:{path}:build", 0)


def test_a_torch_job_is_refused_where_torch_is_missing_naming_what_to_install():
    # A Python where `import torch` fails: None in sys.modules makes it raise ImportError.
    # The spec stays valid; `tailcut run` and `tailcut validate` refuse it on this
    # machine. The operator does not: its pods run the torch worker image
    # (workers.torchImage), whatever the operator's own Python has.
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        from tailcut import plan, spec
        from tailcut.errors import SpecError
        raw = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
               "metadata": {"name": "t"}, "spec": {"training": {"model": "torch-mlp"}}}
        job = spec.from_dict(raw)
        print("kubernetes:", plan.refusals(job, "kubernetes"))
        try:
            plan.check(job, "local")
        except SpecError as err:
            print(err)
        else:
            print("accepted")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "kubernetes: []" in out
    assert "spec.training.model: torch-mlp needs PyTorch here" in out
    assert "PyTorch is not installed" in out
    assert "python3-torch" in out and "scripts/setup.sh" in out
