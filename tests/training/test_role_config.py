"""Tests of RoleConfig: JSON round trip and validation messages that name the field."""

import json
from pathlib import Path
from typing import Any

import pytest

from tailcut.training.config import ConfigError, RoleConfig


def _fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job": "demo",
        "role": "worker",
        "index": 1,
        "ps_host": "10.0.0.1",
        "ps_port": 7000,
        "num_workers": 4,
        "results_dir": "/tmp/demo",
    }
    return {**base, **overrides}


def test_config_survives_a_json_round_trip(tmp_path: Path) -> None:
    cfg = RoleConfig(**_fields(max_iterations=50, target_accuracy=None, transport={"type": "tcp"}))
    cfg.to_json(tmp_path / "c.json")
    assert RoleConfig.from_json(tmp_path / "c.json") == cfg
    assert json.loads((tmp_path / "c.json").read_text())["max_iterations"] == 50


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"role": "aggregator"}, "role='aggregator' index=1"),
        ({"index": 4}, "index=4"),
        ({"role": "ps", "index": 2}, "index=2"),
        ({"ps_port": 0}, "ps_port=0"),
        ({"num_workers": 0}, "num_workers=0"),
        ({"learning_rate": -1.0}, "learning_rate=-1.0"),
        ({"target_accuracy": 1.5}, "target_accuracy=1.5"),
        ({"sync_mode": "hogwild"}, "sync_mode='hogwild'"),
        ({"model": "resnet"}, "supported models are cnn, deep-mlp, even-mlp, mf, mlp, rnn, sparse"),
        (
            {"transport": {"type": "carrier-pigeon"}},
            "transport.type='carrier-pigeon': supported: tcp, udp, bounded-loss, app-drop",
        ),
        ({"transport": "tcp"}, "transport="),
        ({"batch_size": True}, "batch_size=True: must be int"),
        ({"shard_endpoints": ["10.0.0.1"]}, "endpoint '10.0.0.1': must be host:port"),
        ({"role": "ps", "index": 2, "shard_endpoints": ["a:1", "b:1"]},
         "index=2: a PS's index is its shard, in [0, 2)"),
        ({"replica_endpoint": "r:1", "shard_endpoints": ["a:1", "b:1"]},
         "a PS replica needs exactly one shard"),
        ({"aggregators": [{"endpoint": "g:1", "workers": [0, 9]}]},
         "aggregators[0].workers: 9 is not a worker in [0, 4)"),
        ({"aggregators": [{"endpoint": "g:1", "workers": [1]}, {"endpoint": "h:1",
                                                              "workers": [1]}]},
         "worker 1 is already served by aggregators[0]"),
        ({"aggregators": [{"endpoint": "g:1", "workers": [1]}], "sync_mode": "async"},
         "need sync_mode bsp"),
        ({"sync_mode": "ssp", "staleness": -1}, "staleness=-1"),
        ({"ordering": "lifo"}, "ordering='lifo': supported: fifo, stf"),
        ({"aggregation": "median"}, "aggregation='median': must be one of mean, unbiased"),
        ({"rank_racks": [0, 1]}, "rank_racks=[0, 1]: must list one rack index per worker (4)"),
        ({"rank_racks": [0, 0, "a", 1]}, "rank_racks=[0, 0, 'a', 1]: must list one rack"),
        ({"aggregation": "unbiased", "sync_mode": "async"},
         "aggregation='unbiased': combines a bsp iteration's pushes, so it needs sync_mode bsp"),
    ],
)
def test_invalid_fields_are_rejected_with_a_message_naming_them(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        RoleConfig.from_dict(_fields(**overrides))
    assert message in str(info.value)


def test_unknown_and_missing_fields_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown field.*colour"):
        RoleConfig.from_dict(_fields(colour="red"))
    raw = _fields()
    del raw["ps_port"]
    with pytest.raises(ConfigError, match="missing field.*ps_port"):
        RoleConfig.from_dict(raw)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read role config"):
        RoleConfig.from_json(tmp_path / "bad.json")


def test_role_fields_default_to_one_shard_at_ps_host_and_say_who_pushes_where() -> None:
    cfg = RoleConfig(**_fields())
    assert cfg.shards == [("10.0.0.1", 7000)] and cfg.replica is None
    cfg = RoleConfig(**_fields(shard_endpoints=["a:1", "b:2"], replica_endpoint=None,
                               aggregators=[{"endpoint": "g:3", "workers": [0, 2]}]))
    assert cfg.num_shards == 2 and cfg.shards[1] == ("b", 2)
    assert (cfg.aggregator_of(2), cfg.aggregator_of(1)) == (0, None)
    assert cfg.direct_workers() == [1, 3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"flows": {"policy": "coflow", "pace": {"ps-0": {"worker-1": 1e6}}},
          "transport": {"type": "udp"}},
         "flows.policy='coflow': needs transport tcp"),
        ({"flows": {"policy": "coflow", "pace": {"ps-0": {"worker-1": -1}}},
          "transport": {"type": "tcp"}},
         r"flows.pace.ps-0.worker-1=-1: must be a rate > 0"),
    ],
)
def test_a_coflow_flows_section_needs_tcp_and_positive_rates(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        RoleConfig.from_dict(_fields(**overrides))
