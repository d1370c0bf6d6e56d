"""Gradient pipeline invariants: accumulation, loss scaling with skip, clipping, EMA (PyNative and jit)."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import params_np, sgd_mlp
from mindstep import TrainStep, loss_scale
from mindstep.clip import Clip, global_norm
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
@pytest.mark.parametrize("k", [1, 2])
def test_skipped_update_leaves_every_state_bit_identical(k, jit):
    net, opt, step = make("adam", loss_scale="dynamic", accumulate=k, ema=0.9, clip_grad_norm=1.0, jit=jit)
    x, y = data(8)
    for _ in range(2 * k):  # a few real updates first, so moments and EMA are non-trivial
        step(x, y, ONE)
    before = all_state(net, opt, step)
    scale_before = float(step.graph.scale.value.asnumpy())
    metrics = [step(x, y, np.float32(np.inf))] + [step(x, y, ONE) for _ in range(k - 1)]  # overflow in micro-batch 1
    after = all_state(net, opt, step)
    # the state an overflow must change: the loss scale, and the record of skipped updates
    scale_state = {"mindstep.loss_scale", "mindstep.loss_scale_good", "mindstep.skipped", "mindstep.skipped_in_row"}
    changed = {n for n in before if n not in scale_state and not np.array_equal(before[n], after[n])}
    assert changed == set(), f"a skipped update changed {sorted(changed)}"
    assert int(after["mindstep.skipped"]) == int(before["mindstep.skipped"]) + 1
    assert int(after["mindstep.skipped_in_row"]) == 1
    last = metrics[-1]
    assert not bool(last["applied"]) and bool(last["overflow"])
    assert float(last["loss_scale"]) == scale_before / 2
    assert int(after["mindstep.loss_scale_good"]) == 0
    for acc in step.graph.accumulate.get_parameters():
        assert not np.any(acc.asnumpy()), f"{acc.name} must be cleared after a skipped window"
    assert step.compile_count == (1 if jit else 0)
    assert step.update_compile_count == (1 if jit and k > 1 else 0)


@pytest.mark.parametrize("jit", MODES)
def test_dynamic_scale_halves_on_overflow_and_regrows_after_period(jit):
    _, _, step = make(loss_scale=loss_scale.dynamic(init=1024.0, factor=2, period=3), jit=jit)
    x, y = data(4)
    pattern = [np.inf, np.nan, 1, 1, 1, 1, 1, 1, np.inf]
    scales = [float(step(x, y, np.float32(s))["loss_scale"]) for s in pattern]
    assert scales == [512, 256, 256, 256, 512, 512, 512, 1024, 512]
    assert step.compile_count == (1 if jit else 0)


@pytest.mark.parametrize("jit", MODES)
def test_scale_never_goes_below_one(jit):
    _, _, step = make(loss_scale=loss_scale.dynamic(init=2.0, factor=2, period=100), jit=jit)
    x, y = data(4)
    scales = [float(step(x, y, np.float32(np.inf))["loss_scale"]) for _ in range(3)]
    assert scales == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("jit", MODES)
def test_loss_is_reported_in_unscaled_units(jit):
    _, _, plain = make(jit=jit)
    _, _, scaled = make(loss_scale=1024.0, jit=jit)
    x, y = data(8)
    assert float(scaled(x, y, ONE)["loss"]) == pytest.approx(float(plain(x, y, ONE)["loss"]), rel=1e-6)


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


@pytest.mark.parametrize("jit", MODES)
def test_ema_equals_hand_computed_ema(jit):
    decay = 0.8
    net, _, step = make("momentum", ema=decay, jit=jit)
    shadow = params_np(net.trainable_params())
    x, y = data(8)
    for _ in range(4):
        step(x, y, ONE)
        live = params_np(net.trainable_params())
        shadow = {n: decay * shadow[n] + (1 - decay) * live[n] for n in shadow}
    got = {p.name[len("mindstep.ema."):]: p.asnumpy() for p in step.graph.ema.shadow}
    for n in shadow:
        np.testing.assert_allclose(got[n], shadow[n], rtol=1e-5, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("jit", MODES)
def test_ema_weights_swaps_in_and_restores_also_on_exception(jit):
    net, _, step = make("momentum", ema=0.5, jit=jit)
    x, y = data(8)
    for _ in range(3):
        step(x, y, ONE)
    live = params_np(net.trainable_params())
    shadow = {p.name[len("mindstep.ema."):]: p.asnumpy().copy() for p in step.graph.ema.shadow}
    with step.ema_weights():
        inside = params_np(net.trainable_params())
    for n in live:
        np.testing.assert_array_equal(inside[n], shadow[n])
        assert not np.array_equal(live[n], shadow[n])
    with pytest.raises(RuntimeError, match="boom"):
        with step.ema_weights():
            raise RuntimeError("boom")
    restored = params_np(net.trainable_params())
    for n in live:
        np.testing.assert_array_equal(restored[n], live[n])
    step(x, y, ONE)  # the compiled step still trains on the live weights after the swap


def test_ema_weights_without_ema_explains():
    _, _, step = make()
    with pytest.raises(ValueError, match="ema=<decay>"):
        with step.ema_weights():
            pass


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


@pytest.mark.parametrize("jit", MODES)
def test_all_features_together_match_a_hand_written_reference(jit):
    """accumulate=2, dynamic scale, clip by value and norm, EMA, Adam, with an overflow window."""
    k, decay, limit, vlimit, init = 2, 0.9, 0.5, 0.02, 512.0
    net, opt, step = make("adam", accumulate=k, loss_scale=loss_scale.dynamic(init, 2, 2), clip_grad_norm=limit,
                          clip_grad_value=vlimit, ema=decay, jit=jit)
    x, y = data(8 * 6, seed=5)
    factors = [1, 1, np.inf, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    for i, s in enumerate(factors):
        step(x[4 * i: 4 * i + 4], y[4 * i: 4 * i + 4], np.float32(s))

    ref = seeded(MLP)
    ref_opt = nn.Adam(ref.trainable_params(), 1e-2)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, s):
        return loss_fn(ref(x), y) * s

    grad_fn = ms.value_and_grad(forward, None, ref_opt.parameters)
    shadow = [p.asnumpy().copy() for p in ref.trainable_params()]
    scale, good = init, 0
    for w in range(len(factors) // k):
        acc = None
        for i in range(w * k, w * k + k):
            _, g = grad_fn(ms.Tensor(x[4 * i: 4 * i + 4]), ms.Tensor(y[4 * i: 4 * i + 4]), ms.Tensor(np.float32(factors[i])))
            g = [gi.asnumpy() * scale for gi in g]
            acc = g if acc is None else [a + b for a, b in zip(acc, g)]
        grads = [a / (scale * k) for a in acc]
        if not all(np.isfinite(gi).all() for gi in grads):
            scale, good = max(1.0, scale / 2), 0
            continue
        grads = [np.clip(gi, -vlimit, vlimit) for gi in grads]
        norm = math.sqrt(sum(float((gi.astype(np.float64) ** 2).sum()) for gi in grads))
        grads = [gi * (limit / max(norm, limit)) for gi in grads]
        ref_opt(tuple(ms.Tensor(gi.astype(np.float32)) for gi in grads))
        shadow = [decay * s + (1 - decay) * p.asnumpy() for s, p in zip(shadow, ref.trainable_params())]
        good += 1
        if good == 2:
            scale, good = scale * 2, 0

    for p, r in zip(net.trainable_params(), ref.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), r.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)
    for s, r in zip(step.graph.ema.shadow, shadow):
        np.testing.assert_allclose(s.asnumpy(), r, rtol=1e-4, atol=1e-6, err_msg=s.name)
    assert float(step.graph.scale.value.asnumpy()) == scale
    assert step.compile_count == (1 if jit else 0)


@pytest.mark.parametrize("kwargs, exc, words", [
    pytest.param({"accumulate": 0}, ValueError, ["`accumulate`", "0", ">= 1"], id="accumulate-0"),
    pytest.param({"accumulate": 2.0}, TypeError, ["`accumulate`", "2.0"], id="accumulate-float"),
    pytest.param({"normalize": "sum"}, ValueError, ["`normalize`", "'sum'", "'count'"], id="normalize"),
    pytest.param({"clip_grad_norm": 0.0}, ValueError, ["`clip_grad_norm`", "0.0", "> 0.0"], id="clip-0"),
    pytest.param({"clip_grad_norm": "1"}, TypeError, ["`clip_grad_norm`", "'1'"], id="clip-str"),
    pytest.param({"clip_grad_value": -1.0}, ValueError, ["`clip_grad_value`", "-1.0"], id="clipv-neg"),
    pytest.param({"clip_grad_norm": float("inf")}, ValueError, ["`clip_grad_norm`", "inf"], id="clip-inf"),
    pytest.param({"ema": 1.0}, ValueError, ["`ema`", "1.0", "< 1.0", "0.999"], id="ema-1"),
    pytest.param({"ema": 0}, ValueError, ["`ema`", "> 0.0"], id="ema-0"),
    pytest.param({"loss_scale": "auto"}, ValueError, ["`loss_scale`", "'auto'", "'dynamic'"], id="scale-str"),
    pytest.param({"loss_scale": 0.5}, ValueError, ["`loss_scale`", "0.5", ">= 1.0"], id="scale-small"),
    pytest.param({"loss_scale": [1]}, TypeError, ["`loss_scale`", "[1]"], id="scale-list"),
    pytest.param({"loss_scale": True}, TypeError, ["`loss_scale`", "True"], id="scale-bool"),
])
def test_bad_pipeline_arguments(kwargs, exc, words):
    with pytest.raises(exc) as info:
        make(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_bad_dynamic_scale_arguments():
    with pytest.raises(ValueError, match="`loss_scale period`"):
        loss_scale.dynamic(period=0)
    with pytest.raises(ValueError, match="`loss_scale factor`"):
        loss_scale.dynamic(factor=1)


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
