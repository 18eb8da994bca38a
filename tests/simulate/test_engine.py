"""The event loop: compute/communication overlap and what each policy does to it."""

import pytest

from tailcut.simulate import architectures, engine, topology

GBIT = 1e9


def _arch(sizes_bytes, fwd_s):
    layers = tuple(architectures.Layer(f"l{i}", int(b // 4), 1, fwd_s, 2 * fwd_s)
                   for i, b in enumerate(sizes_bytes))
    return architectures.Architecture("toy", layers, 1, "test")


def _run(policy, arch, workers=1, ps=2, tags="priority", tcp="ordered", bw=8 * GBIT):
    fabric = topology.star(workers + ps, bw)
    job = engine.Job("t", arch, list(range(workers)), list(range(workers, workers + ps)))
    return engine.Simulation(fabric, [job], policy, tags, tcp).run()


def test_one_layer_iteration_is_pull_then_compute_then_push():
    # 1 GB/s NIC, 0.5 GB layer: 0.5 s pull, 0.1 s forward, 0.2 s backward, 0.5 s push.
    arch = _arch([0.5e9], 0.1)
    result = _run("fair", arch, workers=1, ps=1)
    assert result.mean_iteration_s() == pytest.approx(1.3, rel=1e-6)


def test_cadentflow_beats_fair_when_two_ps_share_a_workers_downlink():
    # PS0 holds layers 0 and 2, PS1 layers 1 and 3 (greedy placement). Fair gives the
    # worker's downlink half to layer 0 and half to layer 1; priority gives layer 0 all
    # of it, so the forward pass starts twice as early.
    arch = _arch([1e8] * 4, 0.1)
    fair = _run("fair", arch).mean_iteration_s()
    cadent = _run("cadentflow", arch).mean_iteration_s()
    assert cadent < fair * 0.97


def test_coflow_delays_the_first_layer_until_the_whole_pull_is_done():
    arch = _arch([1e6, 1e9], 0.05)
    result = _run("coflow", arch, workers=1, ps=1)
    pulls = [f for f in result.flows if f.phase == engine.PULL]
    assert pulls[0].end_s == pytest.approx(pulls[1].end_s)
    fair = _run("fair", arch, workers=1, ps=1)
    first = next(f for f in fair.flows if f.phase == engine.PULL and f.layer == 0)
    assert first.end_s < pulls[0].end_s / 100


def test_every_message_is_delivered_once_under_every_policy():
    arch = architectures.resnet50()
    for policy in engine.POLICIES:
        result = _run(policy, arch, workers=4, ps=4, bw=10 * GBIT)
        assert all(f.end_s >= f.release_s >= 0 for f in result.flows)
        assert len(result.flows) == 2 * 4 * len(arch.layers)


def test_two_jobs_on_a_shared_uplink_each_report_their_iterations():
    arch = _arch([1e8] * 3, 0.01)
    fabric = topology.shared_racks(10 * GBIT)
    jobs = [engine.Job("a", arch, [0, 1], [24, 25], iterations=3),
            engine.Job("b", arch, [12, 13], [26, 27], iterations=3)]
    result = engine.Simulation(fabric, jobs, "fair").run()
    assert [len(j.iteration_s) for j in result.jobs] == [3, 3]


def test_bad_policy_and_node_outside_the_fabric_are_refused_by_name():
    arch = _arch([1e6], 0.1)
    with pytest.raises(ValueError, match="policy 'edf'"):
        engine.Simulation(topology.star(2, GBIT), [], "edf")
    with pytest.raises(ValueError, match="node 5 is not on the fabric"):
        engine.Simulation(topology.star(2, GBIT), [engine.Job("x", arch, [0], [5])], "fair")


def test_random_tcp_order_is_seeded_and_never_beats_the_best_order():
    arch = architectures.resnet50()
    times = []
    for seed in (1, 1, 2):
        fabric = topology.star(8, 10 * GBIT)
        job = engine.Job("t", arch, list(range(4)), list(range(4, 8)))
        times.append(engine.Simulation(fabric, [job], "fair", tcp="random", seed=seed)
                     .run().mean_iteration_s())
    ordered = _run("fair", arch, workers=4, ps=4, bw=10 * GBIT).mean_iteration_s()
    assert times[0] == times[1]
    assert min(times) >= ordered * (1 - 1e-9)
    assert max(times) > ordered * 1.01


def test_the_papers_toy_example_gives_its_two_completion_times():
    # CadentFlow's Fig. 1: f1 first finishes C's work at 2 s; the coflow-optimal
    # schedule (both flows end together) at 2.5 s; per-tensor TCP shares like coflow.
    from tailcut.simulate import experiments
    times = {row["variant"]: row["completion_s"] for row in experiments.toy()}
    assert times["cadentflow_priority"] == pytest.approx(2.0, rel=1e-6)
    assert times["tcp"] == pytest.approx(2.0, rel=1e-6)
    assert times["coflow"] == pytest.approx(2.5, rel=1e-6)
    assert times["tcp_per_tensor"] == pytest.approx(2.5, rel=1e-6)


def test_a_colocated_worker_gets_its_own_ps_layers_without_the_network():
    # One node is worker and PS: nothing crosses a link, the iteration is compute only.
    arch = _arch([0.5e9, 0.5e9], 0.1)
    job = engine.Job("t", arch, [0], [0])
    result = engine.Simulation(topology.star(1, GBIT), [job], "fair").run()
    assert result.mean_iteration_s() == pytest.approx(0.6, rel=1e-9)
    assert all(f.end_s == f.release_s for f in result.flows)


def test_a_slower_nic_limits_only_its_own_node():
    # 0.5 GB over a 4 Gbit/s NIC (0.5 GB/s) takes 1 s each way, whatever the PS's NIC.
    arch = _arch([0.5e9], 0.1)
    fabric = topology.Fabric(8 * GBIT, (0, 0), node_nic_bit=(4 * GBIT, 40 * GBIT))
    job = engine.Job("t", arch, [0], [1])
    result = engine.Simulation(fabric, [job], "fair").run()
    assert result.mean_iteration_s() == pytest.approx(1 + 0.3 + 1, rel=1e-6)
    with pytest.raises(ValueError, match="node_nic_bit has 1 rates for 2 nodes"):
        topology.Fabric(GBIT, (0, 0), node_nic_bit=(GBIT,))
