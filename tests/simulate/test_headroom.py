"""The headroom sweep: the floors are right (reached where they should be, never beaten),
the baseline is the paper's, and the reason CadentFlow ties ordered TCP holds."""

import dataclasses

import pytest

from tailcut.simulate import architectures, engine, experiments, headroom, topology

GBIT = 1e9


def _arch(sizes_bytes, fwd_s):
    layers = tuple(architectures.Layer(f"l{i}", int(b // 4), 1, fwd_s, 2 * fwd_s)
                   for i, b in enumerate(sizes_bytes))
    return architectures.Architecture("toy", layers, 1, "test")


def _iteration_s(setting, arch, policy, tags="priority", tcp="ordered"):
    fabric, jobs = headroom.build(setting, arch)
    result = engine.Simulation(fabric, jobs, policy, tags, tcp).run()
    skip = 1 if len(jobs) > 1 else 0
    return max(result.mean_iteration_s(j, skip) for j in range(len(jobs))), result


def test_compute_floor_is_the_slowest_workers_compute_and_what_an_unbounded_network_gives():
    arch = architectures.cifarnet()
    job = engine.Job("t", arch, [0, 1, 2], [3], worker_slowdown=[1.0, 1.5, 1.2])
    assert headroom.compute_floor_s(job) == pytest.approx(1.5 * arch.compute_s)
    fast = engine.Simulation(topology.star(4, 1e18), [job], "fair").run()
    assert fast.mean_iteration_s() == pytest.approx(1.5 * arch.compute_s, rel=1e-6)


def test_the_floor_of_one_layer_is_pull_then_compute_then_push_and_the_engine_reaches_it():
    # 1 GB/s NICs, 0.5 GB layer: 0.5 s pull, 0.1 s forward, 0.2 s backward, 0.5 s push.
    arch = _arch([0.5e9], 0.1)
    job = engine.Job("t", arch, [0], [1])
    fabric = topology.star(2, 8 * GBIT)
    floor, what = headroom.floor_s(fabric, job)
    assert floor == pytest.approx(1.3)
    assert what in ("pushes on worker 0's NIC up", "pushes on PS 0's NIC down")
    assert engine.Simulation(fabric, [job], "fair").run().mean_iteration_s() == \
        pytest.approx(floor, rel=1e-6)


@pytest.mark.parametrize("placement", headroom.PLACEMENTS)
def test_no_policy_beats_the_floor_on_any_placement(placement):
    # Compute and communication of a like size, layers of unequal sizes: where the
    # bound is most likely to be wrong if it were.
    toy = _arch([2e6, 8e5, 4e6, 1e6, 6e6, 3e6], 6e-4)
    for arch in (toy, experiments.scaled(architectures.cifarnet(), 0.3)):
        setting = headroom.Setting(placement, arch.name, 8, 8, 1.0)
        fabric, jobs = headroom.build(setting, arch)
        floor = max(headroom.floor_s(fabric, job)[0] for job in jobs)
        assert floor >= max(headroom.compute_floor_s(job) for job in jobs)
        for _, policy, tags, tcp in headroom.VARIANTS + (("", "cadentflow", "staggered",
                                                          "ordered"),):
            took, _ = _iteration_s(setting, arch, policy, tags, tcp)
            assert took >= floor * (1 - 1e-9), (placement, arch.name, policy, tags, tcp)


def test_the_baseline_sends_each_nodes_messages_in_order_with_no_order_between_nodes():
    # The paper's baseline: "the baseline TCP connection transfers the parameters in the
    # best possible order from a given node ... node-level prioritization ... without
    # inter-node considerations".
    arch = _arch([1e8] * 4, 0.01)
    # From one node: one PS holds every layer; they arrive one after the other, in
    # layer order, each at the full 1 GB/s (0.1 s each).
    one = engine.Simulation(topology.star(2, 8 * GBIT),
                            [engine.Job("t", arch, [0], [1])], "fair").run()
    pulls = sorted((f for f in one.flows if f.phase == engine.PULL), key=lambda f: f.layer)
    assert [f.end_s for f in pulls] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    # Between nodes: PS 1 holds layers 0 and 2, PS 2 layers 1 and 3. Layer 0 and
    # layer 1 share the worker's downlink evenly (0.2 s both), though layer 0 is
    # needed first; CadentFlow sends layer 0 first (0.1 s).
    two = engine.Simulation(topology.star(3, 8 * GBIT),
                            [engine.Job("t", arch, [0], [1, 2])], "fair").run()
    ends = {f.layer: f.end_s for f in two.flows if f.phase == engine.PULL}
    assert (ends[0], ends[1]) == pytest.approx((0.2, 0.2))
    cadent = engine.Simulation(topology.star(3, 8 * GBIT),
                               [engine.Job("t", arch, [0], [1, 2])], "cadentflow").run()
    assert next(f.end_s for f in cadent.flows
                if f.phase == engine.PULL and f.layer == 0) == pytest.approx(0.1)


def test_in_a_symmetric_star_per_node_order_is_global_order_though_there_is_headroom():
    # CifarNet, 8 workers / 8 PS on one switch, network-bound: ordered TCP spends 40%
    # above the floor, yet CadentFlow's schedule is TCP's, message by message: each PS
    # sends one layer at a time to all 8 workers at 1/8 of its NIC each, so no worker's
    # downlink ever binds and global priority has nothing left to decide.
    setting = headroom.Setting("star", "cifarnet", 8, 8, 1.0)
    arch = architectures.cifarnet()
    row = headroom.run(setting, arch)
    assert row["headroom"] >= headroom.HALF_THE_CLAIM
    tcp_s, tcp = _iteration_s(setting, arch, "fair")
    for tags in ("priority", "deadline"):
        cf_s, cf = _iteration_s(setting, arch, "cadentflow", tags)
        assert cf_s == pytest.approx(tcp_s, rel=1e-9)
        assert [f.end_s for f in cf.flows] == pytest.approx([f.end_s for f in tcp.flows],
                                                            rel=1e-9)
    # The room is real: an order across workers, which the paper's tags (the same at
    # every worker) cannot express, reaches more than half the claim.
    assert float(row["staggered_vs_tcp"]) <= 1 - headroom.HALF_THE_CLAIM
    # And the symmetry is the reason: with more PS than workers the worker's downlink
    # binds, per-node order is no longer global order, and CadentFlow's schedule differs.
    skew = headroom.Setting("star", "cifarnet", 2, 8, 1.0)
    tcp_s, tcp = _iteration_s(skew, arch, "fair")
    cf_s, cf = _iteration_s(skew, arch, "cadentflow")
    assert cf_s < tcp_s * (1 - 1e-3)
    assert [f.end_s for f in cf.flows] != pytest.approx([f.end_s for f in tcp.flows],
                                                        rel=1e-6)


def test_a_row_carries_the_distance_from_both_floors_and_the_summary_counts_rows():
    points = [headroom.Setting("star", "cifarnet", 2, 8, 1.0),
              headroom.Setting("straggler", "cifarnet", 8, 8, 0.3)]
    rows = headroom.sweep(points)
    for row in rows:
        assert row["tcp_over_compute_floor"] == pytest.approx(
            row["tcp_s"] / row["compute_floor_s"] - 1)
        assert row["headroom"] == pytest.approx(1 - row["floor_s"] / row["tcp_s"])
        assert row["cadentflow_s"] == min(row["cadentflow_priority_s"],
                                          row["cadentflow_deadline_s"])
    assert rows[1]["compute_floor_s"] == pytest.approx(
        headroom.STRAGGLER * 0.3 * architectures.cifarnet().compute_s)
    text = "\n".join(headroom.summary(rows))
    found = sum(r["gain"] >= headroom.HALF_THE_CLAIM for r in rows)
    assert f"at least 12.5%: {found} of 2." in text
    assert "cifarnet" in headroom.format_table(rows)


def test_a_setting_refuses_an_unknown_placement_and_uneven_colocation_by_field():
    with pytest.raises(ValueError, match="placement 'mesh'"):
        headroom.Setting("mesh", "cifarnet", 8, 8, 1.0)
    with pytest.raises(ValueError, match=r"colocated: workers \(8\) and ps \(2\)"):
        headroom.Setting("colocated", "cifarnet", 8, 2, 1.0)
    assert dataclasses.replace(headroom.Setting("star", "cifarnet", 8, 8, 1.0),
                               placement="two-jobs").condition().startswith("cifarnet")


def test_the_figure_has_units_and_a_legend_off_the_data():
    from tests.reports.figure_checks import check_figure
    rows = headroom.sweep([headroom.Setting("star", "cifarnet", 8, 8, 1.0),
                           headroom.Setting("star", "cifarnet", 2, 8, 1.0)])
    fig = headroom.draw(rows, "CadentFlow vs ordered TCP")
    check_figure(fig)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "CadentFlow, star" in labels and any("half the paper" in l for l in labels)
    assert "order across workers (not the paper's tags)" in labels


def test_the_sweep_in_two_processes_gives_the_rows_of_one():
    points = [headroom.Setting("star", "cifarnet", 8, 8, 1.0),
              headroom.Setting("colocated", "cifarnet", 8, 8, 0.3),
              headroom.Setting("racks-4to1", "cifarnet", 8, 8, 1.0)]
    assert headroom.sweep(points, processes=2) == headroom.sweep(points)
