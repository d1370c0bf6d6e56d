"""The CLI as users meet it: help speaks to users, --version, the CPU named, quiet by default;
env and demo print real figures; bad flags are refused."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import mindstep
from mindstep.cli import main

COMMANDS = ("env", "bench", "doctor", "demo")


def _exit_output(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0, argv
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in COMMANDS])
def test_help_speaks_to_users_with_an_example(argv, capsys):
    out = _exit_output(argv, capsys)
    for internal in ("STYLE.md", "principle", "thin parsing", "issue", "TODO", "tests/"):
        assert internal not in out, (argv, internal)
    assert "examples:" in out
    name = argv[0] if len(argv) == 2 else ""
    assert any(line.strip().startswith(f"mindstep {name}".strip()) for line in out.split("examples:")[1].splitlines())
    if argv == ["--help"]:
        for command in COMMANDS:
            assert command in out


def test_version_prints_the_package_version_without_importing_mindspore():
    code = ("import sys; from mindstep.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'mindspore' not in sys.modules, 'importing MindSpore for --version'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"mindstep {mindstep.__version__} (MindSpore 2.10.0, Python ")


def test_env_json_reports_versions_devices_and_run_check(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mindspore"] == "2.10.0"
    assert info["numpy_ok"] is True
    assert set(info["devices"]) == {"Ascend", "GPU", "CPU"}
    assert info["devices"]["CPU"]["usable"] is True
    assert info["cpu_cores"] >= 1 and info["memory_gb"] > 0
    assert info["run_check"]["passed"] is True
    cpu = info["cpu"]
    assert cpu["model"] and cpu["arch"] and cpu["cores"] == info["cpu_cores"]
    assert isinstance(cpu["simd"], list) and cpu["model"] in cpu["summary"]
    assert "gemm_peak" not in info  # only with --peak


def test_env_peak_measures_a_gemm_ceiling(capsys):
    assert main(["env", "--no-run-check", "--peak", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["gemm_peak"]["gflops"] > 0 and info["gemm_peak"]["device"] == "CPU"
    assert "2048x2048" in info["gemm_peak"]["method"]


def test_cpu_summary_names_the_simd_families():
    from mindstep import _cpu

    line = _cpu.summary({"model": "Some CPU", "arch": "x86_64", "cores": 2,
                         "simd": ["avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile", "amx_bf16"]})
    assert line == "Some CPU (x86_64, 2 cores; AVX2, FMA, AVX-512 F/BW, AMX TILE/BF16)"
    assert _cpu.summary({"model": None, "arch": "aarch64", "cores": 4, "simd": ["asimd", "sve"]}) == \
        "unknown CPU (aarch64, 4 cores; ASIMD, SVE)"
    # one feature, two spellings (py-cpuinfo on an AMD EPYC): named once
    assert _cpu.summary({"model": "EPYC", "arch": "x86_64", "cores": 2,
                         "simd": ["avx2", "avx512f", "avx512vnni", "avx512_vnni", "avx512_bf16"]}) == \
        "EPYC (x86_64, 2 cores; AVX2, AVX-512 F/VNNI/BF16)"
    # two CPUs with one brand and one flag set tell apart by family and model, where reported
    assert _cpu.summary({"model": "AMD EPYC", "arch": "x86_64", "cores": 2, "simd": ["avx2"], "family": 25,
                         "model_number": 17}) == "AMD EPYC (family 25 model 17, x86_64, 2 cores; AVX2)"


def test_env_text_names_each_device_and_the_cpu(capsys):
    assert main(["env", "--no-run-check"]) == 0
    out = capsys.readouterr().out
    for word in ("MindSpore", "numpy", "Ascend", "GPU", "CPU", "memory", "SIMD"):
        assert word in out
    from mindstep import _cpu

    assert _cpu.describe()["model"] in out


# A user's script: MindSpore's device probe (its plugin warnings) and a forward that does not fit
# its batch (MindSpore's ANALYZER error with a C++ call stack), in a fresh interpreter.
NOISY = textwrap.dedent("""
    import mindstep
    import mindspore as ms, numpy as np
    from mindspore import nn
    ms.device_context.gpu.is_available()
    net = nn.Dense(4, 2)
    def forward(x):
        return net(x).sum()
    step = mindstep.TrainStep(forward, nn.SGD(net.trainable_params(), 0.1))
    try:
        step(ms.Tensor(np.zeros((3, 5), np.float32)))
    except ValueError as err:
        print("REASON", err)
""")


@pytest.mark.parametrize("glog", [None, "2"])
def test_quiet_by_default_unless_glog_v_is_set(glog, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    if glog is not None:
        env["GLOG_v"] = glog
    script = tmp_path / "user.py"
    script.write_text(NOISY)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # MindSpore's own words stay in mindstep's one-line reason either way
    assert "REASON TrainStep: the step failed" in proc.stdout and "For 'MatMul'" in proc.stdout
    noise = ("[WARNING]", "[ERROR]", "C++ Call Stack", "Device GPU is not available")
    if glog is None:
        assert not [n for n in noise if n in proc.stderr], proc.stderr[-2000:]
    else:  # the user asked for MindSpore's log: it is all there (and this test can tell the difference)
        assert all(n in proc.stderr for n in noise), proc.stderr[-2000:]


def test_verbose_flag_restores_mindspore_log_level():
    code = ("import os, sys; from mindstep import cli\n"
            "cli._verbose(); print(os.environ['GLOG_v'])\n")
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "2", proc.stderr
    env["GLOG_v"] = "1"  # the user's own setting is never touched
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "1", proc.stderr


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
