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
        ({"role": "aggregator"}, "role='aggregator'"),
        ({"index": 4}, "index=4"),
        ({"role": "ps", "index": 2}, "index=2"),
        ({"ps_port": 0}, "ps_port=0"),
        ({"num_workers": 0}, "num_workers=0"),
        ({"learning_rate": -1.0}, "learning_rate=-1.0"),
        ({"target_accuracy": 1.5}, "target_accuracy=1.5"),
        ({"sync_mode": "async"}, "sync_mode='async'"),
        ({"model": "resnet"}, "supported models are cnn, mf, mlp, rnn, sparse"),
        (
            {"transport": {"type": "carrier-pigeon"}},
            "transport.type='carrier-pigeon': supported: tcp",
        ),
        ({"transport": "tcp"}, "transport="),
        ({"batch_size": True}, "batch_size=True: must be int"),
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
