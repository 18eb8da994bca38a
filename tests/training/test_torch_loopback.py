"""A torch model through the real PS and worker roles (tcp, 127.0.0.1): what its numpy
twin does."""

import pytest

from tailcut.ml import torchmodel
from tests.training import loopback

pytestmark = pytest.mark.skipif(not torchmodel.available(),
                                reason="PyTorch is not installed (scripts/setup.sh)")


def test_a_ps_job_of_the_torch_mlp_ends_where_the_numpy_mlps_does(tmp_path):
    """torch-mlp through the PS and workers (tcp): its twin's numbers, same start, same
    minibatches, to float32 rounding."""
    done = {}
    for model in ("mlp", "torch-mlp"):
        job = loopback.Job(tmp_path / model, num_workers=2, options={
            "model": model, "batch_size": 32, "learning_rate": 0.3, "max_iterations": 40,
            "target_accuracy": None, "timeout_s": 120})
        events = job.run()
        done[model] = [e for e in events["ps-0"] if e["event"] == "done"][0]
    assert done["torch-mlp"]["iterations"] == done["mlp"]["iterations"] == 40
    assert done["torch-mlp"]["final_loss"] == pytest.approx(done["mlp"]["final_loss"],
                                                            abs=1e-4)
    assert done["torch-mlp"]["final_accuracy"] == pytest.approx(
        done["mlp"]["final_accuracy"], abs=1e-3)
