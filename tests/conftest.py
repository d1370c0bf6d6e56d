import os

os.environ.setdefault("GLOG_v", "3")  # must precede the MindSpore import: silences C++ WARNING logs

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _pynative_and_seeded():
    """Every test starts in PyNative with a fixed seed, whatever the previous test did."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    yield
    assert ms.get_context("mode") == ms.PYNATIVE_MODE, "a test or the code under test leaked GRAPH_MODE"


def batches(n, shape, classes=10, seed=0, dtype=np.float32):
    """n (x, y) classification batches of float inputs and int32 labels."""
    rng = np.random.default_rng(seed)
    return [(ms.Tensor(rng.standard_normal(shape).astype(dtype)),
             ms.Tensor(rng.integers(0, classes, shape[0]).astype(np.int32))) for _ in range(n)]


def params_np(params):
    return {p.name: p.asnumpy().copy() for p in params}


def assert_params_close(a, b, atol=1e-5, rtol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=atol, rtol=rtol, err_msg=k)


def sgd_mlp(lr=1.0, loss_factor=1.0):
    """(net, SGD optimizer, forward) on the seeded MLP; with lr=1 an update equals the gradient it used."""
    from mindspore import nn

    from mindstep.models import MLP, seeded

    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), lr)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y) * loss_factor

    return net, opt, forward
