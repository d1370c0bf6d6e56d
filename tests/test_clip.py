"""Gradient clipping (`mindstep.clip`): the clipped norm equals the limit, the global norm against
float64, clipping twice, clipping by value (PyNative and jit)."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import params_np, sgd_mlp
from mindstep import TrainStep
from mindstep.clip import Clip, global_norm
from pipeline_cases import MODES, data


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("limit", [0.05, 1e3], ids=["clips", "below-limit"])
def test_clipped_update_norm_equals_limit(limit, jit):
    """With SGD(lr=1) the update is the clipped gradient, so its norm is observable."""
    net, opt, forward = sgd_mlp()
    x, y = data(8)
    _, raw = ms.value_and_grad(forward, None, opt.parameters)(ms.Tensor(x), ms.Tensor(y))
    raw_norm = float(global_norm(raw).asnumpy())
    before = params_np(net.trainable_params())
    m = TrainStep(forward, opt, clip_grad_norm=limit, loss_scale=256.0, jit=jit)(x, y)
    after = params_np(net.trainable_params())
    update_norm = math.sqrt(sum(float(((after[n] - before[n]).astype(np.float64) ** 2).sum()) for n in before))
    assert float(m["grad_norm"]) == pytest.approx(raw_norm, rel=1e-5)
    assert update_norm == pytest.approx(min(limit, raw_norm), rel=1e-4)
    assert (raw_norm > limit) == (limit == 0.05), "the test's limits must straddle the raw norm"


@pytest.mark.parametrize("jit", MODES)
def test_global_norm_matches_float64_over_every_rank(jit):
    """The norm sums each gradient over its first axis, then the rest: scalars, vectors, matrices
    and conv weights must all count every element, as float64 does."""
    rng = np.random.default_rng(2)
    shapes = [(), (7,), (5, 3), (1, 9), (2, 3, 4), (8, 3, 3, 3), (16, 4, 1, 1)]
    grads = [(rng.standard_normal(s) * 10 ** rng.uniform(-3, 3)).astype(np.float32) for s in shapes]
    expected = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))

    class Norm(nn.Cell):
        def construct(self, *gs):
            return global_norm(gs)

    if jit:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        got = float(Norm()(*[ms.Tensor(g) for g in grads]).asnumpy())
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert got == pytest.approx(expected, rel=1e-6)


def test_clipping_twice_changes_nothing():
    rng = np.random.default_rng(1)
    grads = tuple(ms.Tensor(rng.standard_normal(s).astype(np.float32) * 10) for s in [(3, 4), (4,), (2, 2)])
    clip = Clip(norm=1.0, value=None)
    once = clip(grads, global_norm(grads))
    twice = clip(once, global_norm(once))
    assert float(global_norm(once).asnumpy()) == pytest.approx(1.0, rel=1e-6)
    for a, b in zip(once, twice):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6)


@pytest.mark.parametrize("jit", MODES)
def test_clip_by_value_bounds_every_element(jit):
    net, opt, forward = sgd_mlp(loss_factor=100.0)
    x, y = data(8)
    before = params_np(net.trainable_params())
    TrainStep(forward, opt, clip_grad_value=0.01, jit=jit)(x, y)
    after = params_np(net.trainable_params())
    biggest = max(np.abs(after[n] - before[n]).max() for n in before)
    assert biggest == pytest.approx(0.01, rel=1e-5), "some elements must hit the bound, none exceed it"
