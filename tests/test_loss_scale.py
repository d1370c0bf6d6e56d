"""Loss scaling (`mindstep.loss_scale`): a skipped update leaves every state bit-identical, the dynamic
scale's halving and regrowth, the reported loss (PyNative and jit)."""

import numpy as np
import pytest

from mindstep import loss_scale
from pipeline_cases import MODES, ONE, all_state, data, make


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


def test_bad_dynamic_scale_arguments():
    with pytest.raises(ValueError, match="`loss_scale period`"):
        loss_scale.dynamic(period=0)
    with pytest.raises(ValueError, match="`loss_scale factor`"):
        loss_scale.dynamic(factor=1)
