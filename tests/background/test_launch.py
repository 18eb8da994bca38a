"""Command lines of background processes, shared by local runs and Kubernetes pods."""

from pathlib import Path

import pytest

from tailcut.background import launch


def test_standalone_locust_runs_headless_for_the_run_time_plus_spawning():
    argv = launch.locust_argv("py", "standalone", users=8, run_time_s=10,
                              csv_prefix=Path("/r/locust"), host="http://s:8080")
    assert argv[:5] == ["py", "-m", "locust", "-f", str(launch.LOCUSTFILE)]
    assert argv[argv.index("-t") + 1] == "11s" and argv[argv.index("-u") + 1] == "8"
    assert "--master" not in argv and "--worker" not in argv


def test_a_master_waits_for_its_workers_and_a_worker_needs_its_master():
    master = launch.locust_argv("py", "master", users=8, run_time_s=10,
                                csv_prefix=Path("/r/locust"), host="h", expect_workers=3,
                                master_bind_host="10.0.0.1")
    assert master[master.index("--expect-workers") + 1] == "3"
    assert master[master.index("--master-bind-host") + 1] == "10.0.0.1"
    worker = launch.locust_argv("py", "worker", users=8, run_time_s=10,
                                csv_prefix=Path("/r/locust"), host="h", master_host="m.job")
    assert worker[worker.index("--master-host") + 1] == "m.job" and "--csv" not in worker
    with pytest.raises(ValueError, match="master_host"):
        launch.locust_argv("py", "worker", users=1, run_time_s=1, csv_prefix=Path("x"),
                           host="h")
    with pytest.raises(ValueError, match="mode"):
        launch.locust_argv("py", "swarm", users=1, run_time_s=1, csv_prefix=Path("x"),
                           host="h")


def test_servers_outlive_locust_by_its_stop_grace():
    assert launch.server_duration_s(30) == 30 + 2 * launch.LOCUST_STOP_GRACE_S
    assert launch.server_argv("py", 50)[-2:] == ["--duration-s", "50"]
