"""`stratameter config`: the effective settings with their sources, and the errors `run` would refuse."""

from __future__ import annotations

import json

from stratameter.cli import main
from stratameter.config import load_settings
from stratameter.config.command import effective


def test_each_setting_says_where_it_came_from(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    env = {"STRATAMETER_CHUNK_SECONDS": "30", "STRATAMETER_REDIS_PASSWORD_FILE": str(secret)}
    rows = effective(load_settings(env), env)
    assert rows["chunk_seconds"] == {"variable": "STRATAMETER_CHUNK_SECONDS", "value": "30", "source": "environment"}
    assert rows["redis_password"] == {"variable": "STRATAMETER_REDIS_PASSWORD", "value": "**********",
                                      "source": "file"}
    assert rows["delta"]["source"] == "default" and rows["delta"]["value"] == "0.02"
    # unset, and worked out from CHUNK_SECONDS and HISTORY_CHUNKS: the whole chunks of a day the history holds
    assert rows["windows"] == {"variable": "STRATAMETER_WINDOWS", "value": "84m", "source": "derived"}


def test_the_command_prints_json_and_refuses_a_wrong_environment(monkeypatch, capsys):
    for var in [v for v in __import__("os").environ if v.startswith("STRATAMETER_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("STRATAMETER_DELTA", "0.05")
    assert main(["config", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows["delta"] == {"variable": "STRATAMETER_DELTA", "value": "0.05", "source": "environment"}
    monkeypatch.setenv("STRATAMETER_DELTA", "2")
    assert main(["config"]) == 2
    assert "STRATAMETER_DELTA: must be in (0, 0.5), got 2" in capsys.readouterr().err
