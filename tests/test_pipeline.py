"""The whole gradient pipeline: every feature together against a hand-written reference, and the
pipeline's bad arguments (PyNative and jit). Each stage's own invariants are tested beside it:
test_accumulate, test_loss_scale, test_clip, test_ema."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import loss_scale
from mindstep.models import MLP, seeded
from pipeline_cases import MODES, data, make


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
