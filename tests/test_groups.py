"""param_groups: decay/no-decay split, LR multipliers, and the first update's size per group."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep, param_groups
from mindstep.models import ConvNet, seeded


def by_name(groups):
    return {p.name: g for g in groups if "params" in g for p in g["params"]}


def test_biases_and_norm_parameters_get_no_decay():
    net = seeded(ConvNet)
    groups = by_name(param_groups(net, weight_decay=0.1))
    for name, g in groups.items():
        norm_or_bias = name.endswith("bias") or ".1." in name  # features.1 is the BatchNorm2d
        assert g["weight_decay"] == (0.0 if norm_or_bias else 0.1), name
    assert set(groups) == {p.name for p in net.trainable_params()}


def test_order_params_lists_every_trainable_parameter_once():
    net = seeded(ConvNet)
    groups = param_groups(net, weight_decay=0.1)
    assert groups[-1] == {"order_params": net.trainable_params()}
    assert "order_params" not in param_groups(net, order_params=False)[-1]


def first_update_sizes(make_opt, jit=True):
    """|dW| after one step, per parameter, with a loss whose gradient is 1 everywhere."""
    net = seeded(ConvNet)
    opt = make_opt(net)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}

    params = ms.ParameterTuple(net.trainable_params())

    def forward(x):
        total = net(x).sum() * 0.0
        for p in params:
            total = total + p.sum()
        return total

    TrainStep(forward, opt, jit=jit)(np.ones((2, 3, 8, 8), np.float32))
    return {p.name: np.abs(p.asnumpy() - before[p.name]).max() for p in net.trainable_params()}


GROUPED = {
    "nn.Adam": lambda net: nn.Adam(param_groups(net, lr=1e-3, lr_scale={"head.*": 10.0}), 1e-3),
    "nn.AdamWeightDecay": lambda net: nn.AdamWeightDecay(param_groups(net, lr=1e-3, lr_scale={"head.*": 10.0}), 1e-3),
    "nn.Momentum": lambda net: nn.Momentum(param_groups(net, lr=1e-3, lr_scale={"head.*": 10.0}), 1e-3, 0.9),
    "experimental.Adam": lambda net: __import__("mindspore.experimental.optim", fromlist=["Adam"]).Adam(
        param_groups(net, lr=1e-3, lr_scale={"head.*": 10.0}, order_params=False), lr=1e-3),
    "experimental.AdamW": lambda net: __import__("mindspore.experimental.optim", fromlist=["AdamW"]).AdamW(
        param_groups(net, lr=1e-3, lr_scale={"head.*": 10.0}, order_params=False), lr=1e-3, weight_decay=0.0),
}


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
@pytest.mark.parametrize("opt", list(GROUPED))
def test_first_update_magnitude_per_group(opt, jit):
    sizes = first_update_sizes(GROUPED[opt], jit)
    # Adam's first step is lr * sign(grad), SGD/Momentum's lr * grad (grad == 1 here); MindSpore's
    # AdamWeightDecay has no bias correction: its first step is lr * (1 - b1) / sqrt(1 - b2)
    factor = 0.1 / np.sqrt(0.001) if opt == "nn.AdamWeightDecay" else 1.0
    for name, size in sizes.items():
        lr = 1e-2 if name.startswith("head.") else 1e-3
        assert size == pytest.approx(lr * factor, rel=1e-3), (name, size)


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"lr_scale": {"head.*": 10.0}}, ValueError, ["`lr`", "base learning rate"]),
    ({"lr": 1e-3, "lr_scale": {"nothing.*": 2.0}}, ValueError, ["`lr_scale`", "'nothing.*'"]),
    ({"lr": 1e-3, "lr_scale": {"head.*": 0.0}}, ValueError, ["lr_scale['head.*']"]),
    ({"weight_decay": -1.0}, ValueError, ["`weight_decay`", "-1.0"]),
    ({"no_decay": [1]}, TypeError, ["`no_decay`"]),
])
def test_bad_group_arguments(kwargs, exc, words):
    with pytest.raises(exc) as info:
        param_groups(seeded(ConvNet), **kwargs)
    for word in words:
        assert word in str(info.value)


def test_not_a_cell_is_refused():
    with pytest.raises(TypeError, match="`net`"):
        param_groups([ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="w")])
