"""Multi-task losses: components and total agree; learned weights move the documented way."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import mindstep
from mindstep import TrainStep
from mindstep.models import MLP, seeded

MODES = [pytest.param(False, id="pynative"), pytest.param(True, id="jit")]


def two_task(net):
    ce, mse = nn.CrossEntropyLoss(), nn.MSELoss()

    def forward(x, y, t):
        logits = net(x)
        return {"cls": ce(logits, y), "reg": mse(logits[:, 0], t)}

    return forward


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((8, 32)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32),
            (rng.standard_normal(8) * 10).astype(np.float32))


@pytest.mark.parametrize("jit", MODES)
def test_weighted_total_equals_weighted_sum_of_reported_components(jit):
    net = seeded(MLP)
    step = TrainStep(two_task(net), nn.SGD(net.trainable_params(), 0.01), jit=jit,
                     losses=mindstep.losses.weighted({"cls": 1.0, "reg": 5e-3}))
    for _ in range(3):
        m = step(*data())
        assert float(m["loss"]) == pytest.approx(float(m["loss/cls"]) + 5e-3 * float(m["loss/reg"]), rel=1e-6)
    assert step.compile_count == (1 if jit else 0)


@pytest.mark.parametrize("jit", MODES)
def test_weighted_gradient_is_the_weighted_gradient(jit):
    net = seeded(MLP)
    ref = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), 0.1)
    TrainStep(two_task(net), opt, jit=jit, losses=mindstep.losses.weighted({"cls": 0.5, "reg": 0.01}))(*data())
    ref_forward = two_task(ref)
    ref_opt = nn.SGD(ref.trainable_params(), 0.1)

    def combined(x, y, t):
        d = ref_forward(x, y, t)
        return 0.5 * d["cls"] + 0.01 * d["reg"]

    _, g = ms.value_and_grad(combined, None, ref_opt.parameters)(*(ms.Tensor(a) for a in data()))
    ref_opt(g)
    for a, b in zip(net.trainable_params(), ref.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("jit", MODES)
def test_uncertainty_weights_move_toward_inverse_loss(jit):
    """exp(-s) -> 1/L: the large regression loss is down-weighted, the small one up-weighted."""
    net = seeded(MLP)
    weighting = mindstep.losses.uncertainty(["cls", "reg"])
    opt = nn.Adam(net.trainable_params() + weighting.trainable_params(), 0.02)
    step = TrainStep(two_task(net), opt, jit=jit, losses=weighting)
    first = step(*data())
    assert float(first["weight/cls"]) == pytest.approx(1.0) and float(first["weight/reg"]) == pytest.approx(1.0)
    for _ in range(30):
        m = step(*data())
    w = {k: float(m[f"weight/{k}"]) for k in ("cls", "reg")}  # the weights this step's loss used
    expected = sum(w[k] * float(m[f"loss/{k}"]) - np.log(w[k]) for k in w)
    assert float(m["loss"]) == pytest.approx(expected, rel=1e-5), "total = sum exp(-s) L + s"
    assert float(m["loss/reg"]) > float(m["loss/cls"])
    assert float(m["weight/reg"]) < 1.0 < float(m["weight/cls"])


def test_uncertainty_parameters_must_be_optimised():
    net = seeded(MLP)
    weighting = mindstep.losses.uncertainty(["cls", "reg"])
    with pytest.raises(ValueError, match="weighting.trainable_params"):
        TrainStep(two_task(net), nn.Adam(net.trainable_params(), 0.01), losses=weighting)


@pytest.mark.parametrize("make, exc, words", [
    (lambda: mindstep.losses.weighted({"a": -1.0}), ValueError, ["weights['a']"]),
    (lambda: mindstep.losses.weighted([("a", 1.0)]), TypeError, ["`weights`", "dict"]),
    (lambda: mindstep.losses.uncertainty([]), ValueError, ["`names`", "at least one"]),
    (lambda: mindstep.losses.uncertainty(["a", "a"]), ValueError, ["distinct"]),
    (lambda: mindstep.losses.uncertainty(["a b"]), ValueError, ["identifier"]),
])
def test_bad_loss_arguments(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    for word in words:
        assert word in str(info.value)


def test_losses_argument_type_is_checked():
    net = seeded(MLP)
    with pytest.raises(TypeError, match="`losses`"):
        TrainStep(two_task(net), nn.SGD(net.trainable_params(), 0.1), losses={"cls": 1.0})
