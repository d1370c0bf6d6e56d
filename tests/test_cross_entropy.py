"""Composed cross-entropy (`mindstep.optimize.cross_entropy`): each form equals nn.CrossEntropyLoss (loss and
logits gradient, PyNative and GRAPH_MODE, 'mean' and 'sum', ignored labels, float16 logits, a batch of
only ignored labels); other inputs run the original loss; unsupported settings stay native and say
why; the pass reaches a loss Cell that forward uses (`TrainStep.from_net` holds it so it can be
replaced) and the step trains to the same parameters as with the native loss."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep
from mindstep.optimize import cross_entropy, decide, optimize
from mindstep.optimize.cross_entropy import ComposedCrossEntropy


class _Grad(nn.Cell):
    """The loss and its gradient by the logits, as a compiled step computes them."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss
        self.grad = ms.value_and_grad(self._loss)

    def _loss(self, logits, labels):
        return self.loss(logits, labels).astype(ms.float32) * 1.5  # an output gradient that is not 1

    def construct(self, logits, labels):
        return self.grad(logits, labels)


def _batch(rows=12, classes=7, ignore=-100, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows).astype(np.int32)
    labels[[1, 5]] = ignore
    return ms.Tensor((4.0 * rng.standard_normal((rows, classes))).astype(dtype)), ms.Tensor(labels)


def _both(native, logits, labels, graph, form="composed"):
    if graph:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return [[t.asnumpy() for t in _Grad(loss)(logits, labels)]
                for loss in (native, ComposedCrossEntropy(native, form))]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("reduction, ignore", [("mean", -100), ("sum", -100), ("mean", 0)],
                         ids=["mean", "sum", "ignore0"])
@pytest.mark.parametrize("graph", [False, True], ids=["pynative", "graph"])
@pytest.mark.parametrize("form", cross_entropy.FORMS)
def test_composed_cross_entropy_equals_native_loss_and_logits_gradient(reduction, ignore, graph, form):
    native = nn.CrossEntropyLoss(ignore_index=ignore, reduction=reduction)
    logits, labels = _batch(ignore=ignore)
    (loss_n, grad_n), (loss_c, grad_c) = _both(native, logits, labels, graph, form)
    np.testing.assert_allclose(loss_c, loss_n, rtol=1e-6)
    np.testing.assert_allclose(grad_c, grad_n, rtol=1e-5, atol=1e-7)
    assert not grad_c[[1, 5]].any()  # the ignored rows get no gradient


@pytest.mark.parametrize("form", cross_entropy.FORMS)
def test_float16_logits_are_computed_in_float32_and_the_loss_comes_back_in_float16(form):
    native = nn.CrossEntropyLoss()
    logits, labels = _batch(rows=64, classes=50, dtype=np.float16)
    composed = ComposedCrossEntropy(native, form)
    assert composed(logits, labels).dtype == ms.float16
    (loss_n, grad_n), (loss_c, grad_c) = _both(native, logits, labels, True, form)
    assert grad_c.dtype == np.float16
    x, y = logits.asnumpy().astype(np.float64), labels.asnumpy()
    kept = y != -100
    logp = x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)) - x.max(1, keepdims=True)
    want = -1.5 * logp[kept, y[kept]].mean()
    assert abs(float(loss_c) - want) <= max(1.05 * abs(float(loss_n) - want), 2e-3 * abs(want))


@pytest.mark.parametrize("form", cross_entropy.FORMS)
def test_a_batch_of_only_ignored_labels_gives_nan_like_native(form):
    logits, _ = _batch()
    labels = ms.Tensor(np.full(12, -100, np.int32))
    (loss_n, _), (loss_c, grad_c) = _both(nn.CrossEntropyLoss(), logits, labels, True, form)
    assert np.isnan(loss_n) and np.isnan(loss_c)


def test_other_inputs_run_the_original_loss():
    native = nn.CrossEntropyLoss()
    composed = ComposedCrossEntropy(native)
    logits, _ = _batch()
    probs = ms.Tensor(np.random.default_rng(1).dirichlet(np.ones(7), 12).astype(np.float32))
    assert float(composed(logits, probs)) == float(native(logits, probs))  # class probabilities as labels
    images = ms.Tensor(np.random.default_rng(2).standard_normal((2, 7, 3, 3)).astype(np.float32))
    maps = ms.Tensor(np.random.default_rng(3).integers(0, 7, (2, 3, 3)).astype(np.int32))
    assert float(composed(images, maps)) == float(native(images, maps))  # per-pixel classes
    with pytest.raises(ValueError, match="`form` must be one of"):
        ComposedCrossEntropy(native, "fused")


@pytest.mark.parametrize("loss, why", [
    (nn.CrossEntropyLoss(weight=ms.Tensor(np.ones(7, np.float32))), "class weights"),
    (nn.CrossEntropyLoss(label_smoothing=0.1), "label smoothing"),
    (nn.CrossEntropyLoss(reduction="none"), "reduction='none'"),
], ids=["weight", "smoothing", "none"])
def test_unsupported_settings_stay_native_and_say_why(loss, why, tmp_path):
    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ce = loss

        def construct(self, logits, labels):
            return self.ce(logits, labels).mean()

    wrapper = Loss()
    x, y = np.ones((4, 7), np.float32), np.zeros(4, np.int32)
    table = optimize(wrapper, (ms.Tensor(x), ms.Tensor(y)), cache_dir=str(tmp_path), force={"*": "composed"})
    assert [(r["layer"], r["choice"]) for r in table] == [("ce", "native")] and why in table[0]["reason"]
    assert type(wrapper.ce) is nn.CrossEntropyLoss


def test_a_loss_cell_called_directly_is_reported_not_rewritten(tmp_path):
    loss = nn.CrossEntropyLoss()
    logits, labels = _batch()
    table = optimize(loss, (logits, labels), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "no parent Cell" in table[0]["reason"]


def test_measured_with_labels_and_a_scalar_output(tmp_path):
    row = decide.measure_kind(cross_entropy, nn.CrossEntropyLoss(), (32, 20), ms.float32)
    assert set(row["times"]) == {"native", *cross_entropy.FORMS} and row["choice"] in row["times"]
    assert "left out" not in row["reason"]  # every form's loss and gradient matched native's


def _training(rewrite_it, tmp_path):
    """`rewrite_it`: False (native), or the form the loss is forced to."""
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 16), nn.ReLU(), nn.Dense(16, 30))
    loss = nn.CrossEntropyLoss()
    settings = {"force": {"*": rewrite_it}, "cache_dir": str(tmp_path)} if rewrite_it else False
    step = TrainStep.from_net(net, loss, nn.Momentum(net.trainable_params(), 0.1, 0.9), optimize=settings)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 30, 8).astype(np.int32))
            for _ in range(2)]
    losses = [float(step(x, y)["loss"]) for x, y in data * 3]
    return step, loss, losses, {p.name: p.asnumpy() for p in net.get_parameters()}


@pytest.mark.parametrize("form", cross_entropy.FORMS)
def test_from_net_steps_train_to_the_same_parameters_with_the_loss_composed(form, tmp_path):
    _, _, losses_n, params_n = _training(False, tmp_path)
    step, loss, losses_c, params_c = _training(form, tmp_path)
    assert [(r["layer"], r["choice"]) for r in step.optimize_report] == [("loss", form)]
    assert type(loss) is nn.CrossEntropyLoss  # the caller's loss Cell is left as it is
    assert losses_c[-1] < losses_c[0]  # it trains
    np.testing.assert_allclose(losses_c, losses_n, rtol=1e-5)
    for name, value in params_n.items():
        np.testing.assert_allclose(params_c[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_module_level_loss_called_directly_stays_out_of_the_table(tmp_path):
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 16), nn.GELU(), nn.Dense(16, 30))
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    step = TrainStep(forward, nn.Momentum(net.trainable_params(), 0.1, 0.9),
                     optimize={"force": {"*": "composed"}, "cache_dir": str(tmp_path)})
    step(np.ones((4, 6), np.float32), np.zeros(4, np.int32))
    assert [(r["layer"], r["choice"]) for r in step.optimize_report] == [("1", "composed")]
    assert type(loss_fn) is nn.CrossEntropyLoss
