"""`tailcut simulate` prints the table and writes it to the results directory."""

from tailcut import cli


def test_simulate_writes_and_prints_the_fig2_table(tmp_path, capsys):
    code = cli.main(["simulate", "--models", "resnet-50", "--workers", "2",
                     "--bandwidth", "10Gbit", "--compute-scale", "1", "--no-shared",
                     "--no-inference", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "resnet-50" in out
    # the paper's headlines, from tailcut/papers/data/cadentflow.yaml
    assert "fig2.resnet-v1-200.cadentflow-vs-tcp" in out and "0.25 fraction lower" in out
    assert "coflow               2.500 s" in out   # Fig. 1's toy, as the paper computes it
    assert (tmp_path / "fig1-toy.csv").read_text().count("\n") == 7
    assert (tmp_path / "fig2-training.csv").read_text().count("\n") == 2
    assert (tmp_path / "fig2-training.txt").is_file()


def test_simulate_refuses_a_bandwidth_in_bytes_and_an_unknown_model_by_option(capsys):
    assert cli.main(["simulate", "--bandwidth", "10Gbps"]) == 2
    assert "--bandwidth 10Gbps: '10Gbps' is ambiguous" in capsys.readouterr().err
    assert cli.main(["simulate", "--models", "alexnet"]) == 2
    assert "--models: model 'alexnet' is unknown" in capsys.readouterr().err
