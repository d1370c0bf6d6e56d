"""Gradient accumulation (`mindstep.accumulate`): the accumulated update equals the big-batch update,
token-normalised windows, the update graph's in-place reset (PyNative and jit)."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import params_np
from mindstep import TrainStep, loss_scale
from mindstep.models import MLP, seeded
from pipeline_cases import MODES, ONE, OPTIMIZERS, big_batch_reference, data, make


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_accumulated_update_equals_big_batch_update(optimizer, k, jit):
    x, y = data(16 * 2)
    windows = [[(x[w * 16 + i * 16 // k: w * 16 + (i + 1) * 16 // k], y[w * 16 + i * 16 // k: w * 16 + (i + 1) * 16 // k])
                for i in range(k)] for w in range(2)]
    net, opt, step = make(optimizer, accumulate=k, jit=jit)
    for micro in windows:
        for xm, ym in micro:
            step(xm, ym, ONE)
    expected = big_batch_reference(optimizer, windows)
    got = params_np(net.trainable_params())
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert step.compile_count == (1 if jit else 0)
    assert step.update_compile_count == (1 if jit and k > 1 else 0)  # the update graph: once, no inputs


@pytest.mark.parametrize("jit", MODES)
def test_applied_flips_only_on_every_kth_call(jit):
    _, _, step = make(accumulate=3, jit=jit)
    x, y = data(4)
    ms_ = [step(x, y, ONE) for _ in range(7)]
    assert [bool(m["applied"]) for m in ms_] == [False, False, True, False, False, True, False]
    assert [int(m["step"]) for m in ms_] == [0, 0, 1, 1, 1, 2, 2]
    assert [math.isnan(float(m.get("grad_norm", float("nan")))) for m in ms_] == [True] * 7  # no clip: no norm


@pytest.mark.parametrize("jit", MODES)
def test_token_normalised_accumulation_with_unequal_masks_equals_big_batch(jit):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 32)).astype(np.float32)
    y = rng.integers(0, 10, 12).astype(np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0,   1, 0, 0, 0, 0, 0], np.float32)  # 5 tokens vs 1 token
    ce = nn.CrossEntropyLoss(reduction="none")

    def build():
        net = seeded(MLP)
        opt = nn.SGD(net.trainable_params(), 0.5)

        def forward(x, y, m):
            return (ce(net(x), y) * m).sum(), m.sum()

        return net, opt, forward

    net, opt, forward = build()
    step = TrainStep(forward, opt, accumulate=2, normalize="count", jit=jit)
    step(x[:6], y[:6], mask[:6])
    m = step(x[6:], y[6:], mask[6:])
    assert bool(m["applied"])

    ref_net, ref_opt, ref_forward = build()

    def token_mean(x, y, m):
        total, count = ref_forward(x, y, m)
        return total / count

    _, grads = ms.value_and_grad(token_mean, None, ref_opt.parameters)(ms.Tensor(x), ms.Tensor(y), ms.Tensor(mask))
    ref_opt(grads)
    got, expected = params_np(net.trainable_params()), params_np(ref_net.trainable_params())
    for n in expected:
        np.testing.assert_allclose(got[n], expected[n], rtol=1e-5, atol=1e-6, err_msg=n)


def test_update_graph_in_place_equals_the_copying_path_bit_for_bit():
    """The update graph unscales and clips the accumulators in place; the same step built to copy
    them (as the k = 1 graph does) must end with the same bits in every Parameter."""
    x, y = data(4 * 6, seed=7)
    factors = [1, 1, np.inf, 1, 1, 1]
    states = []
    for in_place in (True, False):
        _, _, step = make("adam", accumulate=2, loss_scale=loss_scale.dynamic(256.0, 2, 2), clip_grad_norm=0.5,
                          clip_grad_value=0.02, ema=0.9, jit=True)
        update = step._update_runner.cell
        assert update.in_place is True  # float32 accumulators
        update.in_place = in_place  # before the first call: a compile-time constant
        for i, s in enumerate(factors):
            step(x[4 * i: 4 * i + 4], y[4 * i: 4 * i + 4], np.float32(s))
        states.append({p.name: p.asnumpy().copy() for p in update.get_parameters()})
    assert states[0].keys() == states[1].keys() and len(states[0]) > 3 * len(MLP().trainable_params())
    for name in states[0]:
        assert np.array_equal(states[0][name], states[1][name]), name


@pytest.mark.parametrize("dtype", [ms.float32, ms.float16])
@pytest.mark.parametrize("jit", MODES)
def test_accumulator_reset_writes_positive_zeros_over_anything(jit, dtype):
    """`_map.zero` (the accumulators' reset) leaves +0.0 everywhere, whatever the Parameter held."""
    from mindstep import _map
    from mindstep._context import graph_mode, pynative_mode

    held = np.array([[np.nan, np.inf, -np.inf], [-0.0, -3.5, 7.0]], np.float32)
    params = ms.ParameterTuple([ms.Parameter(ms.Tensor(held, dtype), name="acc.a"),
                                ms.Parameter(ms.Tensor(held[0], dtype), name="acc.b")])

    class Reset(nn.Cell):
        def __init__(self):
            super().__init__()
            self.acc = params

        def construct(self):
            return _map.MAP(_map.zero, self.acc)

    with (graph_mode() if jit else pynative_mode()):
        Reset()()
    for p in params:
        value = p.asnumpy()
        assert value.dtype == ms.dtype_to_nptype(dtype) and value.shape == p.shape
        assert np.array_equal(value, np.zeros(p.shape)) and not np.signbit(value).any(), (p.name, value)


def test_eager_step_takes_the_copying_update_path():
    """MindSpore's CPU in-place multiply (`_map.scale_into`) runs in graphs only: a jit=False step's
    update graph copies instead (same bits, test_update_graph_in_place_equals_the_copying_path_bit_for_bit)."""
    for jit, expected in ((False, False), (True, True)):
        _, _, step = make("adam", accumulate=2, loss_scale="dynamic", clip_grad_norm=0.5, jit=jit)
        assert step._update_runner.cell.in_place is expected
