"""Composed GeLU (`mindstep.optimize.gelu`): equals nn.GELU in both `approximate` forms (forward and
input gradient, PyNative and GRAPH_MODE, over a grid of shapes and values up to the saturated
tails); a rewritten BERT trains to the same parameters as the native one; decisions are measured
per shape under their own cache key and reused; what stays native says why."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep
from mindstep.models import BertMLM, MLMLoss
from mindstep.optimize import optimize
from mindstep.optimize.gelu import ComposedGELU

SHAPES = [(7,), (3, 5), (2, 4, 33), (2, 3, 4, 5)]


def _x(shape, seed=0):
    """Normal values times 3, with the tails in: +-6 and +-30 (saturated in float32) and 0."""
    x = 3.0 * np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:5] = [0.0, 6.0, -6.0, 30.0, -30.0][: flat.size]
    return ms.Tensor(x)


def _value_and_dx(layer, x, r):
    def loss(x):
        return (layer(x) * r).sum()

    return layer(x).asnumpy(), ms.grad(loss)(x).asnumpy()


@pytest.mark.parametrize("approximate", [True, False], ids=["tanh", "erf"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("graph", [False, True], ids=["pynative", "graph"])
def test_composed_gelu_equals_native_forward_and_input_gradient(approximate, shape, graph):
    native = nn.GELU(approximate=approximate)
    composed = ComposedGELU(native)
    x, r = _x(shape), _x(shape, seed=1)
    if graph:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        expected = _value_and_dx(native, x, r)
        got = _value_and_dx(composed, x, r)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    for e, g, what in zip(expected, got, ("forward", "input gradient")):
        assert g.shape == e.shape and np.isfinite(g).all(), what
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * np.abs(e).max(), err_msg=what)


def test_composed_gelu_has_no_parameters_and_rejects_unknown_forms():
    assert ComposedGELU(nn.GELU()).trainable_params() == []
    with pytest.raises(ValueError, match="'fused'"):
        ComposedGELU(nn.GELU(), "fused")


def _bert():
    ms.set_seed(0)
    return BertMLM(vocab=50, hidden=16, layers=2, heads=2, ffn=32, max_len=8)


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_rewritten_bert_trains_to_the_same_parameters(jit, tmp_path):
    rng = np.random.default_rng(0)
    data = [(ms.Tensor(rng.integers(0, 50, (4, 8)).astype(np.int32)),
             ms.Tensor(rng.integers(0, 50, (4, 8)).astype(np.int32))) for _ in range(2)]
    results = []
    for rewrite_it in (False, True):
        net = _bert()
        if rewrite_it:
            table = optimize(net, (data[0][0],), force={"*": "composed"}, cache_dir=str(tmp_path))
            assert [(r["layer"], r["choice"]) for r in table] == [("layers.0.ff.1", "composed"),
                                                                   ("layers.1.ff.1", "composed")]
            assert [type(layer.ff[1]).__name__ for layer in net.layers] == ["ComposedGELU"] * 2
        # momentum, not Adam: Adam divides the key bias's gradient (zero but for float noise: softmax
        # ignores a per-query constant) by its own size and turns the noise into whole steps
        step = TrainStep.from_net(net, MLMLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9), jit=jit)
        losses = [float(step(x, y)["loss"]) for x, y in data * 3]
        results.append((losses, {p.name: p.asnumpy() for p in net.get_parameters()}))
    assert results[1][0][-1] < results[1][0][0]  # it trains
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    assert results[1][1].keys() == results[0][1].keys()
    for name, value in results[0][1].items():
        np.testing.assert_allclose(results[1][1][name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_gelu_decisions_are_measured_per_shape_cached_and_reused(tmp_path):
    from mindstep.optimize.decide import GELU_FORMULATION

    ids = np.ones((2, 8), np.int32)
    table = optimize(_bert(), (ids,), cache_dir=str(tmp_path))
    cache = json.loads((tmp_path / "decisions.json").read_text())
    # both layers see the same (2, 8, 32) input: one measurement, the second layer reads it from the cache
    assert list(cache) == [f"CPU|mindspore-{ms.__version__}|{GELU_FORMULATION}|gelu tanh|in(2, 8, 32) Float32"]
    entry = next(iter(cache.values()))
    assert set(entry["times"]) == {"native", "composed"} and entry["choice"] in ("native", "composed")
    assert [r.get("cached") for r in table] == [False, True]
    assert all(r["config"] == "gelu tanh" and "measured fwd+bwd" in r["reason"] for r in table)
    again = optimize(_bert(), (ids,), cache_dir=str(tmp_path), measure=False)
    assert [r["choice"] for r in again] == [r["choice"] for r in table]
    erf = nn.SequentialCell(nn.Dense(4, 4), nn.GELU(approximate=False))
    optimize(erf, (np.ones((3, 4), np.float32),), cache_dir=str(tmp_path))
    keys = list(json.loads((tmp_path / "decisions.json").read_text()))
    assert any("|gelu none|in(3, 4) Float32" in k for k in keys)


def test_what_stays_native_says_why(tmp_path):
    class MyGELU(nn.GELU):  # a subclass may compute something else: not rewritten
        pass

    net = nn.SequentialCell(nn.Dense(4, 4), MyGELU(), nn.GELU())
    table = optimize(net, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), device="GPU")
    assert [(r["layer"], r["choice"]) for r in table] == [("2", "native")]
    assert "fast on GPU" in table[0]["reason"]
    half = nn.SequentialCell(nn.GELU())
    table = optimize(half, (np.ones((2, 4), np.float16),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "Float16" in table[0]["reason"] and type(half[0]) is nn.GELU
    conv_form = nn.SequentialCell(nn.GELU())  # a conv form forced on a GELU gives its one form
    table = optimize(conv_form, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), force={"*": "one-gemm"})
    assert table[0]["choice"] == "composed" and type(conv_form[0]) is ComposedGELU
