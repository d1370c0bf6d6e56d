"""mindstep installs like a package: the wheel holds the modules, the recipes, the licence and the
console script; the core install does not pull the training recipes' packages; a missing extra gives
one error with its pip line."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, GLOG_v="3")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # built from a copy of what the sdist needs, so the checkout gets no build/ or egg-info of it
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("mindstep-*.whl")
    return path


@pytest.mark.xdist_group("packaging")
def test_the_wheel_holds_what_a_user_runs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("mindstep/__init__.py", "mindstep/step.py", "mindstep/cli.py", "mindstep/doctor/rules.py",
                   "mindstep/train/recipes/resnet.py", "mindstep/py.typed"):
        assert module in names, module
    assert {"mindstep/train/recipes/resnet.yaml", "mindstep/train/recipes/bert.yaml",
            "mindstep/train/recipes/esrgan.yaml"} <= set(names)
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{dist_info}/licenses/LICENSE" in names
    meta = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    entry = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "mindstep = mindstep.cli:main" in entry
    core = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert any("mindspore<2.11,>=2.10.0" in line.replace(" ", "") for line in core), core
    for heavy in ("scikit-learn", "scikit-image", "tokenizers", "matplotlib", "pillow", "pydantic"):
        assert not any(heavy in line for line in core), f"{heavy} is in the core install"
    for extra in ("train", "bench", "docs", "test", "all"):
        assert f"Provides-Extra: {extra}" in meta
    assert "License-Expression: Apache-2.0" in meta and "Classifier:" in meta
    assert not any(n.startswith(("tests/", "docs/")) for n in names)


@pytest.mark.xdist_group("packaging")
def test_the_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    """Installed into a folder of its own (its dependencies from this environment), the wheel imports,
    trains a step and answers on its console script, from a directory that is not the checkout."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = dict(ENV, PYTHONPATH=str(target))
    script = ("import mindstep, numpy as np\nfrom mindspore import nn\n"
              "net = nn.Dense(2, 1)\nstep = mindstep.TrainStep.from_net(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))\n"
              "m = step(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32))\n"
              "print(mindstep.__file__, int(m['step']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, steps = proc.stdout.split()
    assert where.startswith(str(target)) and steps == "1"
    proc = subprocess.run([str(target / "bin" / "mindstep"), "--version"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("mindstep 0.1.0"), proc.stdout + proc.stderr


def test_a_missing_extra_names_its_pip_line(tmp_path):
    """Without the train extra's packages (blocked here), `mindstep train` stops with one line: what
    is missing and the pip command; the core still imports and builds a step."""
    script = ("import sys\nfor name in ('pydantic', 'yaml', 'sklearn'):\n    sys.modules[name] = None\n"
              "import mindstep\nfrom mindstep.cli import main\n"
              "code = main(['train', '--recipe', 'resnet', '--steps', '1'])\nprint('exit', code)\n"
              "print(mindstep.TrainStep.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exit 2" in proc.stdout and "TrainStep" in proc.stdout
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert "pydantic, pyyaml, scikit-learn" in err[0] and 'pip install "mindstep[train]"' in err[0]
