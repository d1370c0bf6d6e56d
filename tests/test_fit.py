"""`mindstep.fit`: every kind of training data resumes at the exact batch (the same final weights
as an uninterrupted run), the callbacks do what they say (EarlyStopping stops, ReduceLROnPlateau
lowers the LR of the compiled step without a recompile, BestCheckpoint keeps the k best), the
trackers write what they are given (read back), and bad arguments are refused before anything runs.

Tiny networks, one process for the whole module.
"""
import csv
import glob
import json
import warnings

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

import mindstep
from mindstep.loop import (BestCheckpoint, Callback, EarlyStopping, Mean, ReduceLROnPlateau, ResumeWarning,
                           classification)
from mindstep.loop.loggers import read_scalars

pytestmark = pytest.mark.xdist_group("fit")
RNG = np.random.default_rng(0)
X = RNG.standard_normal((48, 4)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32)
BATCHES = [(X[i:i + 8], Y[i:i + 8]) for i in range(0, 48, 8)]  # 6 batches an epoch


def make(lr=0.1, **kw):
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2))
    return mindstep.TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), lr, 0.9), **kw)


def weights(step):
    return [p.asnumpy().copy() for p in step.net.trainable_params()]


class StopAt(Callback):
    """Interrupts a run after `n` step calls (the loop saves, as at any stop)."""

    def __init__(self, n):
        self.n = n

    def on_step_end(self, loop, metrics):
        if loop.done == self.n:
            loop.request_stop("test")


def _shuffled_dataset():
    ds.config.set_seed(3)
    return ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=True).batch(8)


def _generator_epoch(epoch):
    order = np.random.default_rng(epoch).permutation(len(BATCHES))
    return (BATCHES[i] for i in order)  # an iterable that cannot seek: a resume replays it


KINDS = {
    "sequence": lambda: BATCHES,
    "dataset": _shuffled_dataset,
    "callable-dataset": lambda: (lambda epoch: ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False)
                                 .skip(epoch % 2).batch(8, drop_remainder=True)),
    "callable-generator": lambda: _generator_epoch,
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_interrupted_mid_epoch_resumes_to_the_uninterrupted_weights(kind, tmp_path):
    full = make()
    summary = mindstep.fit(full, KINDS[kind](), epochs=3, progress=False)
    assert summary["steps"] in (18, 17)  # the skipping callable drops a batch on odd epochs
    part = make()
    first = mindstep.fit(part, KINDS[kind](), epochs=3, out=tmp_path, callbacks=[StopAt(8)], progress=False)
    assert first["stopped"] == "test" and first["steps"] == 8
    resumed = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = mindstep.fit(resumed, KINDS[kind](), epochs=3, out=tmp_path, resume=True,
                             callbacks=[StopAt(-1)], progress=False)
    assert again["resumed_from"] == 8 and again["steps"] == summary["steps"]
    replayed = [w for w in caught if issubclass(w.category, ResumeWarning)]
    assert bool(replayed) == (kind == "callable-generator")  # only what cannot seek reads batches again
    for a, b in zip(weights(full), weights(resumed)):
        assert np.array_equal(a, b)


def test_steps_run_epoch_after_epoch_and_logs_checkpoints_and_evaluations_land_where_said(tmp_path):
    step = make(ema=0.9)
    s = mindstep.fit(step, BATCHES, steps=10, eval_data=BATCHES[:2], eval_every=4, save_every=4, keep=2,
                     eval_fn=classification(loss_fn=nn.CrossEntropyLoss()), out=tmp_path, log_every=3, progress=False)
    assert s["steps"] == 10 and s["epochs"] == 2 and set(s["eval"]) == {"accuracy_initial", "loss_initial",
                                                                        "accuracy", "loss"}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in records if "eval" in r] == [0, 4, 8, 10]
    assert [r["batch"] for r in records if "loss" in r] == [3, 6, 9, 10]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.ckpt")) == ["batch-0000008.ckpt", "batch-0000010.ckpt"]
    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {(int(r["batch"]), r["name"]) for r in rows if r["kind"] == "eval"} >= {(0, "accuracy"), (10, "loss")}
    # evaluated with the EMA weights: the live weights are back afterwards
    with step.ema_weights():
        ema = weights(step)
    assert not all(np.array_equal(a, b) for a, b in zip(ema, weights(step)))


def test_a_function_is_a_callback_for_every_event(tmp_path):
    seen = []
    mindstep.fit(make(), BATCHES, epochs=1, eval_fn=classification(), eval_data=BATCHES[:1], out=tmp_path,
                 log_every=3, progress=False,
                 callbacks=[lambda event, loop, value: seen.append((event, loop.done))])
    events = [e for e, _ in seen]
    assert events[0] == "start" and events[-1] == "end"
    assert events.count("step_end") == 6 and events.count("log") == 2 and ("eval", 0) in seen and "save" in events


def test_early_stopping_stops_after_patience_evaluations_without_improvement():
    def constant(step, data):
        return {"score": 1.0}

    s = mindstep.fit(make(), BATCHES, epochs=5, eval_fn=constant, eval_every=2,
                     callbacks=[EarlyStopping("score", patience=2, mode="max")], progress=False)
    assert s["steps"] == 4 and "EarlyStopping: score did not improve" in s["stopped"]  # evals at 0, 2, 4


def test_reduce_lr_on_plateau_lowers_the_compiled_steps_lr_without_a_recompile():
    step = make(lr=0.1)
    mindstep.fit(step, BATCHES, steps=2, progress=False)
    compiled = step.compile_count
    cb = ReduceLROnPlateau("score", factor=0.5, patience=2)  # evaluations 1-6 do not improve: 3 reductions
    mindstep.fit(step, BATCHES, steps=6, eval_fn=lambda s, d: {"score": 1.0}, eval_every=1, callbacks=[cb],
                 progress=False)
    assert step.compile_count == compiled  # the LR is written in place
    assert cb.total == pytest.approx(0.5 ** 3) and step.lr_factor == pytest.approx(0.5 ** 3)
    assert float(step.optimizer.learning_rate.asnumpy()) == pytest.approx(0.1 * 0.5 ** 3)


def test_scale_lr_gives_the_update_of_the_lowered_lr_with_or_without_a_schedule():
    x, y = BATCHES[0]
    for schedule in (None, mindstep.schedules.constant(0.1)):
        a, b = make(0.1, lr_schedule=schedule), make(0.025, lr_schedule=None if schedule is None else
                                                        mindstep.schedules.constant(0.025))
        a(x, y), b(x, y)
        a.optimizer.moments[0].set_data(b.optimizer.moments[0])  # same state up to the LR
        a.scale_lr(0.25)
        for p, q in zip(a.net.trainable_params(), b.net.trainable_params()):
            p.set_data(q.value().copy())
        for o, r in zip(a.optimizer.moments, b.optimizer.moments):
            o.set_data(r.value().copy())
        a(x, y), b(x, y)
        for p, q in zip(weights(a), weights(b)):
            np.testing.assert_allclose(p, q, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="factor"):
        a.scale_lr(0.0)


def test_best_checkpoint_keeps_the_k_best_by_the_metric(tmp_path):
    scores = iter([0.0, 0.5, 0.9, 0.2, 0.7, 0.1])
    cb = BestCheckpoint("score", k=2, mode="max")
    mindstep.fit(make(), BATCHES, steps=5, eval_fn=lambda s, d: {"score": next(scores)}, eval_every=1,
                 callbacks=[cb], out=tmp_path, progress=False)
    kept = sorted((tmp_path / "best").glob("*.ckpt"))
    assert [p.name for p in kept] == ["batch-0000002.ckpt", "batch-0000004.ckpt"]  # 0.9 and 0.7
    assert cb.best_path().endswith("batch-0000002.ckpt")
    assert mindstep.checkpoint.read_manifest(cb.best_path())["extra"]["value"] == 0.9


def test_tensorboard_and_mlflow_hold_every_logged_value(tmp_path):
    from mlflow.tracking import MlflowClient

    mindstep.fit(make(), BATCHES, epochs=1, eval_fn=classification(), eval_data=BATCHES[:1], out=tmp_path,
                 log_every=2, progress=False, loggers=["tensorboard", "mlflow"])
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    expected = {(f"train/{k}", r["batch"]) for r in logged if "eval" not in r for k, v in r.items()
                if k != "batch" and v is not None}
    expected |= {(f"eval/{k}", r["batch"]) for r in logged if "eval" in r for k in r["eval"]}
    assert len(glob.glob(str(tmp_path / "tb" / "*"))) == 1
    tb = set(read_scalars(tmp_path / "tb"))
    assert expected <= tb and ("summary/final_loss", 0) in tb
    client = MlflowClient("file:" + str(tmp_path / "mlruns"))
    run_id = (tmp_path / "mlflow_run_id").read_text()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "accumulate" in run.data.params
    ml = {(k, m.step) for k in run.data.metrics if not k.startswith("summary/")
          for m in client.get_metric_history(run_id, k)}
    assert expected == ml
    # a fresh run into the same folder starts every log over: the files, and a new MLflow run
    mindstep.fit(make(), BATCHES[:2], epochs=1, out=tmp_path, log_every=1, progress=False,
                 loggers=["mlflow", mindstep.loop.JSONLLogger("mine.jsonl")])
    assert (tmp_path / "mlflow_run_id").read_text() != run_id
    for name in ("metrics.jsonl", "mine.jsonl"):
        assert [json.loads(line)["batch"] for line in (tmp_path / name).read_text().splitlines()] == [1, 2]


def test_mean_metrics_are_weighted_by_samples_and_plain_values_by_rank(monkeypatch):
    from mindstep.loop import evaluate

    monkeypatch.setattr(evaluate, "_all_reduce", lambda v: v + np.array([3.0, 1.0, 0.2, 1.0]))  # another rank
    merged = evaluate.merge({"acc": Mean(1.0, 4), "score": 0.6}, world=2)
    assert merged == {"acc": pytest.approx(4 / 5), "score": pytest.approx(0.4)}
    with pytest.raises(TypeError, match="eval_fn's value 'bad'"):
        evaluate.merge({"bad": "x"}, world=1)


@pytest.mark.parametrize("kwargs, words", [
    ({}, "exactly one of the two"),
    ({"steps": 2, "epochs": 1}, "exactly one of the two"),
    ({"steps": 0}, "steps"),
    ({"steps": 2, "eval_data": BATCHES}, "eval_fn"),
    ({"steps": 2, "resume": True}, "out"),
    ({"steps": 2, "resume": "yes", "out": "x"}, "resume"),
    ({"steps": 2, "callbacks": [EarlyStopping]}, "callbacks[0]"),
    ({"steps": 2, "loggers": ["wandb"]}, "loggers[0]"),
])
def test_bad_arguments_are_refused_naming_the_argument(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words.replace("[", r"\[")):
        mindstep.fit(make(), BATCHES, progress=False, **kwargs)


def test_data_that_cannot_be_read_twice_or_resumed_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(TypeError, match="can be read only once"):
        mindstep.fit(make(), iter(BATCHES), epochs=1, progress=False)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        mindstep.fit(make(), BATCHES, epochs=1, out=tmp_path, resume=True, progress=False)
    s = mindstep.fit(make(), BATCHES, epochs=1, out=tmp_path, resume="auto", progress=False)
    assert s["resumed_from"] is None and s["steps"] == 6
