"""Checkpoints: the whole training state, atomic writes, exact resume, clear errors on mismatch."""
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

import mindstep
from mindstep.checkpoint import CheckpointError, CheckpointWarning, latest, read_manifest, state

ONE = np.float32(1.0)


def build(width=16, accumulate=2, compiler="cell", jit=True, dropout=True, seed=0):
    """A step with every stateful stage: Adam, BatchNorm, dropout, loss scale, accumulate, EMA, schedule."""
    ms.set_seed(seed)
    layers = [nn.Dense(8, width), nn.BatchNorm1d(width), nn.ReLU()]
    if dropout:
        layers.append(mindstep.Dropout(0.2))
    net = nn.SequentialCell(layers + [nn.Dense(width, 4)])

    def forward(x, y, s):  # cross-entropy from per-row ops (see README: nn.CrossEntropyLoss's kernel)
        onehot = ops.one_hot(y, 4, ms.Tensor(1.0), ms.Tensor(0.0))
        return -(ops.log_softmax(net(x), -1) * onehot).sum(-1).mean() * s

    step = mindstep.TrainStep(forward, nn.Adam(net.trainable_params(), 1e-2), jit=jit, compiler=compiler,
                              loss_scale="dynamic", accumulate=accumulate, ema=0.9,
                              lr_schedule=mindstep.schedules.cosine_decay(1e-2, 20))
    return net, step


def batches(n, overflow_at=()):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 4, 4).astype(np.int32),
             np.float32(np.inf) if i in overflow_at else ONE) for i in range(n)]


def snapshot(step):
    return {n: p.asnumpy().copy() for n, p in state(step).items()}


def metrics_np(m):
    return {k: np.asarray(v.asnumpy()).tolist() for k, v in m.items()}


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_save_writes_the_payload_and_a_manifest_that_describes_it(tmp_path, fmt):
    _, step = build(jit=False)
    for b in batches(3):
        step(*b)
    path = step.save(tmp_path / "run" / "step-3", format=fmt)
    assert path.name == f"step-3.{fmt}" and path.exists()
    manifest = json.loads((tmp_path / "run" / f"step-3.{fmt}.json").read_text())
    assert manifest["format_version"] == 1 and manifest["mindstep"] == mindstep.__version__
    assert manifest["mindspore"] == ms.__version__ and manifest["device"] == "CPU"
    assert manifest["payload"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["settings"]["accumulate"] == 2 and manifest["settings"]["ema"] == 0.9
    assert manifest["settings"]["loss_scale"]["kind"] == "dynamic"
    names = {t["name"] for t in manifest["tensors"]}
    expected = {"0.weight", "1.moving_mean", "3.calls", "moment1.0.weight", "global_step", "mindstep.step",
                "mindstep.loss_scale", "mindstep.micro", "mindstep.acc.0.weight", "mindstep.ema.0.weight"}
    assert expected <= names, expected - names
    assert not [f for f in os.listdir(tmp_path / "run") if f.startswith(".")], "no temporary file is left"


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_load_restores_every_tensor_bit_identically(tmp_path, fmt):
    _, step = build()
    for b in batches(5, overflow_at=(1,)):
        step(*b)
    saved = snapshot(step)
    path = step.save(tmp_path / "a", format=fmt)
    _, fresh = build(seed=1)  # other initial weights
    fresh.load(path)
    got = snapshot(fresh)
    assert got.keys() == saved.keys()
    for name, value in saved.items():
        assert np.array_equal(got[name], value) and got[name].dtype == value.dtype, name


@pytest.mark.parametrize("compiler", ["cell", "function", "eager"])
def test_loading_into_a_step_that_already_ran_takes_effect_in_the_compiled_graph(tmp_path, compiler):
    _, step = build(compiler=compiler if compiler != "eager" else "cell", jit=compiler != "eager")
    data = batches(9, overflow_at=(2,))
    for b in data[:5]:
        step(*b)
    path = step.save(tmp_path / "mid")
    first = [metrics_np(step(*b)) for b in data[5:]]
    after_first = snapshot(step)
    compiles = step.compile_count
    step.load(path)
    again = [metrics_np(step(*b)) for b in data[5:]]
    assert again == first
    assert all(np.array_equal(v, after_first[n]) for n, v in snapshot(step).items())
    assert step.compile_count == compiles, "loading must not recompile"


def test_a_checkpoint_that_does_not_fit_is_refused_with_every_difference(tmp_path):
    _, step = build(jit=False)
    step(*batches(1)[0])
    path = step.save(tmp_path / "a")
    _, other = build(width=12, accumulate=1, dropout=False, jit=False)
    with pytest.raises(CheckpointError) as info:
        other.load(path)
    text = str(info.value)
    assert "setting accumulate: the step has 1, the checkpoint 2" in text
    assert "unexpected in the checkpoint: '3.seed', '3.calls', '4.weight'" in text
    assert "missing from the checkpoint: '3.weight'" in text
    assert "0.weight: the step has [12, 8] Float32, the checkpoint [16, 8] Float32" in text
    assert "strict=False" in text


def test_strict_false_loads_what_fits_and_names_what_it_skipped(tmp_path):
    _, step = build(jit=False)
    step(*batches(1)[0])
    saved = snapshot(step)
    path = step.save(tmp_path / "a")
    _, other = build(dropout=False, seed=3, jit=False)
    with pytest.warns(CheckpointWarning, match="unexpected in the checkpoint: '3.seed', '3.calls'"):
        other.load(path, strict=False)
    got = snapshot(other)
    assert np.array_equal(got["0.weight"], saved["0.weight"]) and np.array_equal(got["1.moving_mean"],
                                                                                  saved["1.moving_mean"])
    assert not np.array_equal(got["3.weight"], saved["4.weight"])  # the head moved from 4 to 3: not loaded
    assert np.array_equal(got["mindstep.loss_scale"], saved["mindstep.loss_scale"])


def test_load_errors_are_clear(tmp_path):
    _, step = build(jit=False)
    with pytest.raises(CheckpointError, match="no manifest"):
        step.load(tmp_path / "nothing.ckpt")
    with pytest.raises(TypeError, match="`path`"):
        step.load(3)
    with pytest.raises(TypeError, match="`strict`"):
        step.load(tmp_path / "x.ckpt", strict="yes")
    with pytest.raises(ValueError, match="`format`"):
        step.save(tmp_path / "x", format="pt")
    with pytest.raises(ValueError, match="`keep`"):
        step.save(tmp_path / "x", keep=0)


def test_latest_skips_torn_and_corrupt_checkpoints_naming_them(tmp_path):
    _, step = build(jit=False)
    paths = []
    for i, b in enumerate(batches(3)):
        step(*b)
        paths.append(step.save(tmp_path / f"step-{i}"))
        time.sleep(0.01)
    assert latest(tmp_path) == paths[-1]
    torn = tmp_path / "step-9.ckpt"  # a payload whose save died before its manifest
    torn.write_bytes(paths[-1].read_bytes())
    data = bytearray(paths[-1].read_bytes())  # the newest complete one, corrupted afterwards
    data[len(data) // 2] ^= 0xFF
    paths[-1].write_bytes(bytes(data))
    with pytest.warns(CheckpointWarning) as record:
        found = latest(tmp_path)
    assert found == paths[-2]
    text = " ".join(str(r.message) for r in record)
    assert "step-9.ckpt" in text and "no manifest" in text and "step-2.ckpt" in text and "corrupt" in text
    with pytest.raises(CheckpointError, match="corrupt"):
        read_manifest(paths[-1])
    assert latest(tmp_path / "absent") is None


def test_keep_removes_older_checkpoints_only_after_a_newer_one_is_complete(tmp_path):
    _, step = build(jit=False)
    for i, b in enumerate(batches(4)):
        step(*b)
        step.save(tmp_path / f"step-{i}", keep=2)
        time.sleep(0.01)
    assert sorted(os.listdir(tmp_path)) == ["step-2.ckpt", "step-2.ckpt.json", "step-3.ckpt", "step-3.ckpt.json"]


def test_saving_a_net_with_kernel_dropout_warns_that_it_cannot_resume_exactly(tmp_path):
    net = nn.SequentialCell(nn.Dense(4, 4), nn.Dropout(p=0.5))
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x):
        return net(x).sum()

    step = mindstep.TrainStep(forward, opt)
    with pytest.warns(CheckpointWarning, match="mindstep.resumable_dropout"):
        step.save(tmp_path / "a")


# ---- resume in a fresh process ---------------------------------------------------------------------
RESUME = textwrap.dedent('''
    import json, sys
    import numpy as np, mindspore as ms
    from mindspore import nn, ops
    import mindstep

    MODE, FOLDER = sys.argv[1], sys.argv[2]
    SAVE_AT = 7  # after 7 calls: in the middle of an accumulation window, after the overflow at call 3


    def build(compiler, cross_entropy):
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(8, 16), nn.BatchNorm1d(16), nn.ReLU(), mindstep.Dropout(0.2), nn.Dense(16, 4))
        ce = nn.CrossEntropyLoss()

        def forward(x, y, s):
            logits = net(x)
            if cross_entropy:
                return ce(logits, y) * s
            onehot = ops.one_hot(y, 4, ms.Tensor(1.0), ms.Tensor(0.0))
            return -(ops.log_softmax(logits, -1) * onehot).sum(-1).mean() * s

        mode = {"jit": False} if compiler == "eager" else {"compiler": compiler}
        schedule = mindstep.schedules.warmup(3, mindstep.schedules.cosine_decay(1e-2, 20))
        return net, mindstep.TrainStep(forward, nn.Adam(net.trainable_params(), 1e-2), loss_scale="dynamic",
                                       accumulate=2, ema=0.9, lr_schedule=schedule, **mode)


    rng = np.random.default_rng(0)
    DATA = [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 4, 4).astype(np.int32),
             np.float32(np.inf if i == 3 else 1.0)) for i in range(16)]
    results = {}
    for compiler, cross_entropy in [("cell", False), ("function", False), ("eager", False), ("cell", True)]:
        key = compiler + ("-ce" if cross_entropy else "")
        net, step = build(compiler, cross_entropy)
        if MODE == "save":
            for batch in DATA[:SAVE_AT]:
                step(*batch)
            step.save(f"{FOLDER}/{key}.ckpt")
        else:
            step.load(f"{FOLDER}/{key}.ckpt")
        state = {n: p.asnumpy().tolist() for n, p in mindstep.checkpoint.state(step).items()}
        metrics = [{k: np.asarray(v.asnumpy()).tolist() for k, v in step(*b).items()} for b in DATA[SAVE_AT:]]
        final = {n: p.asnumpy().tolist() for n, p in mindstep.checkpoint.state(step).items()}
        results[key] = {"state": state, "metrics": metrics, "final": final}
    print("RESULTS " + json.dumps(results))
''')


def _run(script, *args, timeout=600):
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))[len("RESULTS "):])


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    script = folder / "train.py"
    script.write_text(RESUME)
    return _run(script, "save", str(folder)), _run(script, "load", str(folder))


@pytest.mark.xdist_group("checkpoint-resume")  # shares the module fixture `resumed`
@pytest.mark.parametrize("key", ["cell", "function", "eager"])
def test_a_run_resumed_in_a_fresh_process_continues_bit_identically(resumed, key):
    uninterrupted, resumed_run = resumed[0][key], resumed[1][key]
    assert resumed_run["state"] == uninterrupted["state"], "the loaded state differs from the saved one"
    assert resumed_run["metrics"] == uninterrupted["metrics"]
    assert resumed_run["final"] == uninterrupted["final"]
    assert [m["applied"] for m in uninterrupted["metrics"]][:2] == [True, False], "saved mid-window"


@pytest.mark.xdist_group("checkpoint-resume")  # shares the module fixture `resumed`
def test_cross_entropy_resumes_within_one_ulp(resumed):
    """MindSpore 2.10's CPU cross-entropy kernel sums over the batch in blocks whose size it picks by
    timing its first launches in each process, so a fresh process rounds its loss differently for a
    while (README, "Checkpoints and resume"); the state itself is restored bit for bit."""
    uninterrupted, resumed_run = resumed[0]["cell-ce"], resumed[1]["cell-ce"]
    assert resumed_run["state"] == uninterrupted["state"]
    for a, b in zip(resumed_run["metrics"], uninterrupted["metrics"]):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)
    for name, value in uninterrupted["final"].items():
        np.testing.assert_allclose(resumed_run["final"][name], value, rtol=1e-5, atol=1e-7, err_msg=name)


# ---- SIGKILL during saves -----------------------------------------------------------------------------
SAVER = textwrap.dedent('''
    import sys
    import numpy as np, mindspore as ms
    from mindspore import nn, ops
    import mindstep

    folder, first = sys.argv[1], int(sys.argv[2])
    ms.set_seed(0)
    net = nn.Dense(64, 64)

    def forward(x):
        return net(x).sum()

    step = mindstep.TrainStep(forward, nn.Adam(net.trainable_params(), 1e-3), jit=False)
    params = mindstep.checkpoint.state(step)
    i = first
    while True:  # every tensor of checkpoint i holds the value i
        for p in params.values():
            ops.assign(p, ms.Tensor(np.full(p.shape, i, ms.dtype_to_nptype(p.dtype))))
        step.save(f"{folder}/ck-{i:07d}.ckpt", keep=3)
        if i == first:
            print("saved", flush=True)
        i += 1
''')


@pytest.mark.slow
def test_a_save_killed_at_any_moment_leaves_a_loadable_checkpoint(tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    ms.set_seed(0)
    net = nn.Dense(64, 64)

    def forward(x):
        return net(x).sum()

    step = mindstep.TrainStep(forward, nn.Adam(net.trainable_params(), 1e-3), jit=False)
    rng = random.Random(0)
    for round_ in range(20):
        child = subprocess.Popen([sys.executable, str(script), str(folder), str(round_ * 100_000)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdout.readline().strip() == "saved"
        time.sleep(rng.uniform(0.0, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)  # torn saves are expected here
            path = latest(folder)
        assert path is not None
        index = int(path.name[3:10])
        assert index >= round_ * 100_000
        step.load(path)
        for name, p in state(step).items():
            assert np.all(p.asnumpy() == index), f"{path.name}: {name} is not the saved value {index}"


def test_a_path_without_suffix_loads_what_save_wrote(tmp_path):
    """`step.save("state")` writes state.ckpt; `step.load("state")` and `read_manifest("state")` read it."""
    _, step = build(jit=False)
    for batch in batches(2):
        step(*batch)
    written = step.save(tmp_path / "state")
    assert written.name == "state.ckpt"
    assert read_manifest(tmp_path / "state")["step"] == 1
    _, step2 = build(jit=False)
    step2.load(str(tmp_path / "state"))
    assert snapshot(step2).keys() == snapshot(step).keys()
    for name, value in snapshot(step).items():
        np.testing.assert_array_equal(snapshot(step2)[name], value, err_msg=name)
