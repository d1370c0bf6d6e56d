"""What the gradient pipeline's tests share: the modes, optimizers, data, a step on the MLP, the
state a skipped update must leave alone, and the big-batch reference."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import params_np
from mindstep import TrainStep
from mindstep.models import MLP, seeded

MODES = [pytest.param(False, id="pynative"), pytest.param(True, id="jit")]
OPTIMIZERS = {
    "sgd": lambda p: nn.SGD(p, 0.1),
    "momentum": lambda p: nn.Momentum(p, 0.1, 0.9),
    "adam": lambda p: nn.Adam(p, 1e-2),
}


def data(n, seed=0, classes=10, features=32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, features)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32))


def make(optimizer="adam", *, net_factory=MLP, **kwargs):
    net = seeded(net_factory)
    opt = OPTIMIZERS[optimizer](net.trainable_params())
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, s):
        return loss_fn(net(x), y) * s

    return net, opt, TrainStep(forward, opt, **kwargs)


ONE = np.float32(1.0)


def all_state(net, opt, step):
    """Every Parameter that a skipped update must leave alone (net, optimizer incl. moments, step state)."""
    return {**params_np(net.get_parameters()), **params_np(opt.get_parameters()),
            **params_np(step.state_parameters())}


def big_batch_reference(optimizer, windows):
    """Plain value_and_grad + optimizer on the concatenated micro-batches of each window."""
    net = seeded(MLP)
    opt = OPTIMIZERS[optimizer](net.trainable_params())
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for micro in windows:
        x = np.concatenate([m[0] for m in micro])
        y = np.concatenate([m[1] for m in micro])
        _, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        opt(grads)
    return params_np(net.trainable_params())
