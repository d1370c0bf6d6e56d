"""`mindstep train` on the user's own network and data: a model from the user's file with weights
saved by another framework (names mapped, a strict report), an image folder with unreadable files,
a text folder, and mindcv's ResNet-18 through its import path on a 10-class image folder: trains,
evaluates, checkpoints, stops early, and resumes to the same bits.

The mindcv run is three `python -m mindstep train` processes, as a user runs them; mindcv 0.3.0 is
installed with --no-deps into a temporary folder (its own dependencies pin an older MindSpore).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import mindstep
from mindstep.train import config, recipes

pytestmark = pytest.mark.xdist_group("train_any_model")

USER_MODEL = '''
from mindspore import nn, ops


class Net(nn.Cell):
    def __init__(self, in_channels, num_classes, width=4):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, has_bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.head = nn.Dense(width, num_classes)

    def construct(self, x):
        return self.head(ops.mean(ops.relu(self.bn(self.conv(x))), axis=(2, 3)))
'''


def _resolve(recipe, *overrides):
    return config.resolve(recipes.defaults(recipe), None, list(overrides))


def _digit_folder(root, per_class=20, size=32, corrupt=False):
    """scikit-learn's digits as PNGs, one subfolder per class."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for label in range(10):
        folder = root / f"digit{label}"
        folder.mkdir(parents=True)
        for i, image in enumerate(d.images[d.target == label][:per_class]):
            big = Image.fromarray((image * 255 / 16).astype(np.uint8)).resize((size, size))
            big.convert("RGB").save(folder / f"{i}.png")
    if corrupt:
        (root / "digit3" / "broken.png").write_bytes(b"not a png")
    return root


def test_a_model_from_the_users_file_starts_from_pytorch_named_weights(tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "my_models.py").write_text(USER_MODEL)
    spec = f"{tmp_path / 'my_models.py'}:Net"
    cfg = _resolve("resnet", f"model.factory={spec}", "model.args={width: 6}")
    recipe = recipes.build(cfg)
    net = recipe.build()
    assert net.head.weight.shape == (10, 6) and net.conv.weight.shape[1] == 1  # num_classes, in_channels filled in
    rng = np.random.default_rng(1)
    torch_names = {"conv.weight": (6, 1, 3, 3), "bn.weight": (6,), "bn.bias": (6,), "bn.running_mean": (6,),
                   "bn.running_var": (6,), "head.weight": (10, 6), "head.bias": (10,)}
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in torch_names.items()}
    save_file({**values, "bn.num_batches_tracked": np.array(7, np.int64)}, str(tmp_path / "w.safetensors"))
    cfg = _resolve("resnet", f"model.factory={spec}", "model.args={width: 6}",
                   f"model.init_from={tmp_path / 'w.safetensors'}", "model.init_map=torch")
    recipe = recipes.build(cfg)
    net = recipe.build()
    assert len(recipe.init_report["loaded"]) == 7 and not recipe.init_report["missing"]
    assert np.array_equal(net.bn.moving_variance.asnumpy(), values["bn.running_var"])
    assert np.array_equal(net.bn.gamma.asnumpy(), values["bn.weight"])
    # without the map: one error that lists what is missing and unexpected, with the closest names
    cfg = _resolve("resnet", f"model.factory={spec}", "model.args={width: 6}", f"model.init_from={tmp_path / 'w.safetensors'}")
    with pytest.raises(config.ConfigError) as err:
        recipes.build(cfg).build()
    text = str(err.value)
    assert "missing: " in text and "bn.moving_mean (closest: bn.running_mean)" in text and "unexpected: " in text


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_xyz:Net", "cannot import 'no_such_module_xyz'"),
    ("./nowhere.py:Net", "does not exist"),
    ("mindspore.nn:NoSuchCell", "has no 'NoSuchCell'"),
    ("json:dumps", "not a mindspore.nn.Cell"),
    ("noseparator", "expected 'package.module:callable'"),
])
def test_a_bad_factory_is_one_error_naming_model_factory(spec, words):
    with pytest.raises(config.ConfigError, match="model.factory") as err:
        recipes.build(_resolve("resnet", f"model.factory={spec}", "model.args={obj: 1}" if "json" in spec else
                               "model.args={}")).build()
    assert words in str(err.value)


def test_unreadable_images_raise_naming_the_file_or_are_skipped_and_noted(tmp_path):
    folder = _digit_folder(tmp_path / "img", per_class=3, size=12, corrupt=True)
    with pytest.raises(config.ConfigError, match="broken.png"):
        recipes.build(_resolve("resnet", f"data.path={folder}"))
    r = recipes.build(_resolve("resnet", f"data.path={folder}", "data.on_error=skip"))
    assert len(r.train_set[1]) + len(r.test_set[1]) == 30 and "broken.png" in r.notes[0]
    # training augmentation: the same crops for the same epoch (a resume), others for the next
    a, b, c = r.epoch(0)[0], r.epoch(0)[0], r.epoch(1)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c) and a.shape[1:] == (3, 8, 8)


def test_the_mlm_recipe_reads_a_folder_of_text_files(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("\n\n".join(f"doc {i} paragraph {j}: the quick brown fox jumps " * 3
                                                      for j in range(30)))
    b = recipes.build(_resolve("bert", f"data.path={tmp_path}", "model.vocab_size=100", "model.seq_len=16"))
    assert len(b.train_set[0]) > 0 and len(b.test_set[0]) > 0


@pytest.fixture(scope="module")
def mindcv_path(tmp_path_factory):
    target = tmp_path_factory.mktemp("mindcv")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           "mindcv==0.3.0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(target)


def _train(cfg_path, out, mindcv_path, *extra):
    env = {**os.environ, "PYTHONPATH": mindcv_path + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "mindstep", "train", "--config", str(cfg_path), "--out", str(out),
                           "--json", str(out) + ".json", *extra], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with open(str(out) + ".json") as fh:
        return json.load(fh)


def test_mindcv_resnet18_from_its_import_path_trains_stops_early_and_resumes_bit_exact(tmp_path, mindcv_path):
    folder = _digit_folder(tmp_path / "digits", per_class=16)
    cfg = {"recipe": "resnet", "data": {"path": str(folder), "batch_size": 16, "workers": 1},
           "model": {"factory": "mindcv.models:create_model", "args": {"model_name": "resnet18"}, "image_size": 32},
           "optim": {"lr": 0.01}, "schedule": {"name": "constant"},
           "train": {"steps": 8, "eval_every": 2, "save_every": 2, "log_every": 1,
                     "early_stopping": {"monitor": "accuracy", "mode": "max", "patience": 2, "min_delta": 1.0}}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    full = _train(path, tmp_path / "full", mindcv_path)
    # evaluations at 0 (the best), 2 and 4 (no gain of 1.0 in accuracy): stopped at 4 of 8
    assert full["steps"] == 4 and full["stopped"].startswith("EarlyStopping: accuracy")
    assert {"accuracy_initial", "accuracy"} <= set(full["eval"])
    _train(path, tmp_path / "part", mindcv_path, "train.steps=2")
    resumed = _train(path, tmp_path / "part", mindcv_path, "--resume")
    assert resumed["resumed_from"] == 2 and resumed["steps"] == 4 and resumed["stopped"] == full["stopped"]
    a = mindstep.checkpoint.read_manifest(full["checkpoint"])
    b = mindstep.checkpoint.read_manifest(resumed["checkpoint"])
    assert a["payload"]["sha256"] == b["payload"]["sha256"]  # the same bits
