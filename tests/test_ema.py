"""EMA (`mindstep.ema`): the hand-computed average, `ema_weights()` swapping in and restoring (PyNative
and jit)."""

import numpy as np
import pytest

from conftest import params_np
from pipeline_cases import MODES, ONE, data, make


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
