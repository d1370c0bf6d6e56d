"""The thin CLI: env and demo print real figures; bad flags are refused."""
import json

import pytest

from mindstep.cli import main


def test_env_json_reports_versions_devices_and_run_check(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mindspore"] == "2.10.0"
    assert info["numpy_ok"] is True
    assert set(info["devices"]) == {"Ascend", "GPU", "CPU"}
    assert info["devices"]["CPU"]["usable"] is True
    assert info["cpu_cores"] >= 1 and info["memory_gb"] > 0
    assert info["run_check"]["passed"] is True


def test_env_text_names_each_device(capsys):
    assert main(["env", "--no-run-check"]) == 0
    out = capsys.readouterr().out
    for word in ("MindSpore", "numpy", "Ascend", "GPU", "CPU", "memory"):
        assert word in out


def test_demo_prints_measured_rows(capsys):
    assert main(["demo", "--steps", "2", "--batch-size", "4", "--image-size", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == ["pynative", "jit"]
    assert rows[0]["loss_first"] == pytest.approx(rows[1]["loss_first"], rel=1e-5)
    assert rows[1]["compile_count"] == 1 and rows[0]["compile_count"] == 0
    assert all(r["step_ms_median"] > 0 for r in rows)


def test_demo_rejects_zero_steps(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "0"])
    assert "must be an int >= 1" in capsys.readouterr().err
