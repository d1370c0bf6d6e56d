"""Non-finite updates without (and with) loss scaling: skip by default, raise, or apply."""
import numpy as np
import pytest
from mindspore import nn, ops

from conftest import params_np
from mindstep import NonFiniteError, TrainStep
from mindstep.models import MLP, seeded

MODES = [pytest.param(False, id="pynative"), pytest.param(True, id="jit")]
ONE, NAN, INF = np.float32(1.0), np.float32(np.nan), np.float32(np.inf)


def data(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 32)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def make(optimizer=nn.Adam, grouped=False, **kwargs):
    net = seeded(MLP)
    params = net.trainable_params()
    if grouped:  # two groups: the first layer, the second layer
        params = [{"params": params[:2], "lr": 1e-2}, {"params": params[2:], "lr": 1e-3}]
    opt = optimizer(params, 1e-2)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, s):
        return loss_fn(net(x), y) * s

    return net, opt, TrainStep(forward, opt, **kwargs)


def every_state(net, opt, step, skip=("mindstep.skipped", "mindstep.skipped_in_row")):
    state = {**params_np(net.get_parameters()), **params_np(opt.get_parameters()),
             **params_np(step.state_parameters())}
    return {k: v for k, v in state.items() if k not in skip}


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("bad", [NAN, INF], ids=["nan", "inf"])
def test_default_skips_a_non_finite_update_without_loss_scaling(bad, k, jit):
    net, opt, step = make(accumulate=k, ema=0.9, jit=jit)
    x, y = data()
    for _ in range(2 * k):
        step(x, y, ONE)
    before = every_state(net, opt, step)
    metrics = [step(x, y, bad)] + [step(x, y, ONE) for _ in range(k - 1)]
    after = every_state(net, opt, step)
    changed = sorted(n for n in before if not np.array_equal(before[n], after[n]))
    assert changed == [], f"a skipped update changed {changed}"
    last = metrics[-1]
    assert not bool(last["applied"]) and int(last["skipped"]) == 1 and int(last["skipped_in_row"]) == 1
    for acc in step.graph.accumulate.get_parameters():
        assert not np.any(acc.asnumpy()), f"{acc.name} must be cleared after a skipped window"
    m = [step(x, y, ONE) for _ in range(k)][-1]  # the next window applies and resets the run of skips
    assert bool(m["applied"]) and int(m["skipped"]) == 1 and int(m["skipped_in_row"]) == 0
    assert step.compile_count == (1 if jit else 0)


@pytest.mark.parametrize("jit", MODES)
def test_too_many_skips_in_a_row_raise_naming_the_count(jit):
    net, opt, step = make(max_consecutive_skips=3, jit=jit)
    x, y = data()
    step(x, y, ONE)
    for _ in range(2):
        step(x, y, NAN)
    weights = params_np(net.trainable_params())
    with pytest.raises(NonFiniteError, match="3 updates in a row") as info:
        step(x, y, NAN)
    assert "max_consecutive_skips=3" in str(info.value) and "learning rate" in str(info.value)
    assert all(np.array_equal(weights[n], v) for n, v in params_np(net.trainable_params()).items())
    assert bool(step(x, y, ONE)["applied"]), "the step goes on after the error"


@pytest.mark.parametrize("jit", MODES)
def test_raise_names_the_loss_when_the_loss_is_not_finite(jit):
    net, opt, step = make(on_nonfinite="raise", jit=jit)
    x, y = data()
    step(x, y, ONE)
    before = every_state(net, opt, step)
    with pytest.raises(NonFiniteError, match="the loss is nan"):
        step(x, y, NAN)
    assert all(np.array_equal(before[n], v) for n, v in every_state(net, opt, step).items())


@pytest.mark.parametrize("jit", MODES)
def test_raise_names_the_parameters_and_group_whose_gradient_is_not_finite(jit):
    net = seeded(MLP)
    params = net.trainable_params()
    opt = nn.Adam([{"params": params[:2], "lr": 1e-2}, {"params": params[2:], "lr": 1e-3}], 1e-2)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, s):
        # with s = 0: sqrt of a value that is 0 but depends on fc2.bias: a finite loss whose gradient
        # (1 / (2 sqrt(0))) is infinite for fc2.bias alone
        u = (net.fc2.bias - ops.stop_gradient(net.fc2.bias)).sum() + s
        return loss_fn(net(x), y) + ops.sqrt(u)

    step = TrainStep(forward, opt, on_nonfinite="raise", jit=jit)
    x, y = data()
    step(x, y, ONE)
    before = params_np(net.trainable_params())
    with pytest.raises(NonFiniteError) as info:
        step(x, y, np.float32(0.0))
    text = str(info.value)
    assert "the loss is finite" in text and "'fc2.bias'" in text and "group1" in text
    assert "'fc1.weight'" not in text and "'fc2.weight'" not in text
    assert all(np.array_equal(before[n], v) for n, v in params_np(net.trainable_params()).items())


def test_apply_is_the_old_behaviour_and_needs_no_loss_scale():
    net, opt, step = make(on_nonfinite="apply")
    x, y = data()
    step(x, y, ONE)
    m = step(x, y, NAN)
    assert bool(m["applied"]) and "skipped" not in m
    assert np.isnan(net.fc1.weight.asnumpy()).any(), "'apply' applies the non-finite update as it is"
    with pytest.raises(ValueError, match="loss_scale=None"):
        make(on_nonfinite="apply", loss_scale="dynamic")


def test_with_a_loss_scale_an_overflow_under_a_finite_loss_does_not_raise():
    net, opt, step = make(on_nonfinite="raise", loss_scale=2.0 ** 120)
    x, y = data()
    m = step(x, y, np.float32(1e4))  # 2**120 * the gradients of 1e4 * loss overflow; the loss is finite
    assert not bool(m["applied"]) and bool(m["overflow"]) and int(m["skipped"]) == 1


@pytest.mark.parametrize("kwargs, error, words", [
    ({"on_nonfinite": "ignore"}, ValueError, ["`on_nonfinite`", "'skip'", "'raise'", "'apply'"]),
    ({"on_nonfinite": True}, TypeError, ["`on_nonfinite`"]),
    ({"max_consecutive_skips": 0}, ValueError, ["`max_consecutive_skips`", ">= 1"]),
    ({"max_consecutive_skips": 2.5}, TypeError, ["`max_consecutive_skips`"]),
], ids=["unknown-policy", "bool-policy", "zero-skips", "float-skips"])
def test_nonfinite_settings_are_validated(kwargs, error, words):
    with pytest.raises(error) as info:
        make(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_finite_check_finds_a_non_finite_element_in_every_gradient():
    """The check multiplies each gradient by a zero vector; a NaN or Inf in any element of any
    gradient must read as not finite, and huge finite values as finite, in GRAPH_MODE, as
    `mindspore.amp.all_finite` says."""
    import mindspore as ms
    from mindspore import amp

    import mindstep.nonfinite as nonfinite

    shapes = [(4, 5), (3,), (7, 7), (2, 2, 2), (6,), (50,), (), (3, 4, 3, 3)]
    check = nonfinite.FiniteCheck("t", per_param=False)

    class Probe(nn.Cell):
        def __init__(self):
            super().__init__()
            self.check = check

        def construct(self, *grads):
            return self.check.all_finite(grads), amp.all_finite(grads)

    probe = Probe()
    rng = np.random.default_rng(0)
    base = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    base[2][:] = np.float32(3e38)  # finite, and no sum of them fits in float32: still finite
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ours, theirs = probe(*[ms.Tensor(g) for g in base])
        assert bool(ours.asnumpy()) and bool(theirs.asnumpy())
        for i, shape in enumerate(shapes):
            for where in sorted({0, base[i].size // 2, base[i].size - 1}):
                for bad in (np.nan, np.inf, -np.inf):
                    grads = [g.copy() for g in base]
                    grads[i].reshape(-1)[where] = bad
                    ours, theirs = probe(*[ms.Tensor(g) for g in grads])
                    assert not bool(ours.asnumpy()) and not bool(theirs.asnumpy()), (shape, where, bad)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
