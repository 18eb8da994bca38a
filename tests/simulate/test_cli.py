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


def test_simulate_headroom_only_writes_the_sweep_and_its_figure(tmp_path, capsys, monkeypatch):
    from tailcut.simulate import headroom
    cheap = [headroom.Setting("star", "cifarnet", 2, 8, 1.0),
             headroom.Setting("colocated", "cifarnet", 8, 8, 1.0)]
    asked = []
    monkeypatch.setattr(headroom, "settings", lambda grid: asked.append(grid) or cheap)
    code = cli.main(["simulate", "--headroom", "quick", "--headroom-only",
                     "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and asked == ["quick"]
    assert "Headroom: 2 settings" in out and "at least 12.5%:" in out
    assert "Fig. 1" not in out                     # --headroom-only skips Fig. 1-4
    assert (tmp_path / "headroom.csv").read_text().count("\n") == 3
    assert (tmp_path / "headroom.png").stat().st_size > 0
    assert cli.main(["simulate", "--headroom-only"]) == 2
    assert "--headroom-only: give --headroom quick" in capsys.readouterr().err


def test_fig2_and_fig3_rows_carry_the_baselines_distance_from_the_compute_floor():
    from tailcut.simulate import architectures, experiments
    arch = architectures.cifarnet()
    train, = experiments.single_app(["cifarnet"], [2], [10e9])
    infer, = experiments.single_app(["cifarnet"], [2], [10e9], inference=True)
    assert train["compute_floor_s"] == arch.compute_s
    assert infer["compute_floor_s"] == sum(l.fwd_s for l in arch.layers)  # no backward
    for row in (train, infer):
        assert row["tcp_over_compute_floor"] == row["tcp_s"] / row["compute_floor_s"] - 1
