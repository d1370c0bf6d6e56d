"""Composed GeLU and LayerNorm (`mindstep.optimize.gelu`, `.layernorm`): each equals the native layer
(forward and all gradients, PyNative and GRAPH_MODE, over a grid of shapes; GeLU in both
`approximate` forms and up to the saturated tails); a rewritten BERT trains to the same parameters
as the native one; decisions are measured per shape under their own cache key and reused; what
stays native says why."""
import functools
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep
from mindstep.models import BertMLM, MLMLoss
from mindstep.optimize import optimize
from mindstep.optimize.gelu import ComposedGELU
from mindstep.optimize.layernorm import ComposedLayerNorm

SHAPES = [(7,), (3, 5), (2, 4, 33), (2, 3, 4, 5)]


def _x(shape, seed=0):
    """Normal values times 3, with the tails in: +-6 and +-30 (saturated in float32) and 0."""
    x = 3.0 * np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:5] = [0.0, 6.0, -6.0, 30.0, -30.0][: flat.size]
    return ms.Tensor(x)


def _grads(layer, x, r):
    """[output, input gradient, *parameter gradients] of `(layer(x) * r).sum()`."""
    def loss(x):
        return (layer(x) * r).sum()

    params = layer.trainable_params()
    dx, dps = ms.grad(loss, grad_position=0, weights=params)(x) if params else (ms.grad(loss)(x), ())
    return [layer(x).asnumpy(), dx.asnumpy()] + [g.asnumpy() for g in dps]


def assert_matches_native(native, composed, x, r, graph, names, rtol):
    """`composed` gives `native`'s output and gradients (`names` them), in GRAPH_MODE if `graph`."""
    if graph:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        expected, got = _grads(native, x, r), _grads(composed, x, r)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert len(got) == len(expected) == len(names)
    for e, g, what in zip(expected, got, names):
        assert g.shape == e.shape and np.isfinite(g).all(), what
        np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-5 * np.abs(e).max(), err_msg=what)


@pytest.mark.parametrize("approximate", [True, False], ids=["tanh", "erf"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("graph", [False, True], ids=["pynative", "graph"])
def test_composed_gelu_equals_native_forward_and_input_gradient(approximate, shape, graph):
    native = nn.GELU(approximate=approximate)
    assert_matches_native(native, ComposedGELU(native), _x(shape), _x(shape, seed=1), graph,
                          ("forward", "input gradient"), rtol=1e-5)


LN_SHAPES = [(3, 8), (2, 5, 16), (2, 3, 4, 7)]


@pytest.mark.parametrize("shape", LN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("graph", [False, True], ids=["pynative", "graph"])
def test_composed_layernorm_equals_native_forward_and_all_gradients(shape, graph):
    rng = np.random.default_rng(0)
    native = nn.LayerNorm((shape[-1],), epsilon=1e-5)
    native.gamma.set_data(ms.Tensor(rng.standard_normal(shape[-1]).astype(np.float32)))
    native.beta.set_data(ms.Tensor(rng.standard_normal(shape[-1]).astype(np.float32)))
    composed = ComposedLayerNorm(native)
    assert [id(p) for p in composed.trainable_params()] == [id(p) for p in native.trainable_params()]
    x = ms.Tensor((2.0 * rng.standard_normal(shape) + 1.0).astype(np.float32))
    r = ms.Tensor(rng.standard_normal(shape).astype(np.float32))
    assert_matches_native(native, composed, x, r, graph, ("forward", "input gradient", "gamma", "beta"), rtol=1e-4)


@pytest.mark.parametrize("kind", ["gelu", "layernorm"])
def test_float16_inputs_are_computed_in_float32_and_come_back_in_float16(kind):
    # mixed precision hands these layers float16; the composed forms compute in float32 inside, so their
    # gradients are at least as near the float64 result as native's float16 kernels
    rng = np.random.default_rng(0)
    x64 = 3.0 * rng.standard_normal((4, 6, 32))
    x64.reshape(-1)[:2] = [60.0, -300.0]  # float16's x^3 and x^2 would overflow here
    r64 = rng.standard_normal((4, 6, 32))
    if kind == "gelu":
        native, make, f64 = nn.GELU(), ComposedGELU, _gelu_f64
    else:
        native = nn.LayerNorm((32,))
        native.gamma.set_data(ms.Tensor(rng.standard_normal(32).astype(np.float32)))
        make, f64 = ComposedLayerNorm, functools.partial(_layernorm_f64, gamma=native.gamma.asnumpy())
    x, r = ms.Tensor(x64.astype(np.float16)), ms.Tensor(r64.astype(np.float32))

    def results(layer):
        def loss(x):
            return (layer(x).astype(ms.float32) * r).sum()

        out = layer(x)
        grads = ms.grad(loss, grad_position=0, weights=layer.trainable_params())(x)
        grads = [grads[0], *grads[1]] if isinstance(grads, tuple) else [grads]
        return out, grads

    (out_n, grads_n), (out_c, grads_c) = results(native), results(make(native))
    assert out_c.dtype == ms.float16 and grads_c[0].dtype == ms.float16
    truth = f64(x.asnumpy().astype(np.float64), r64)
    for g_n, g_c, want in zip(grads_n, grads_c, truth):
        want_scale = np.abs(want).max()
        err_c = np.abs(g_c.asnumpy().astype(np.float64) - want).max() / want_scale
        err_n = np.abs(g_n.asnumpy().astype(np.float64) - want).max() / want_scale
        assert np.isfinite(g_c.asnumpy()).all() and err_c <= max(1.05 * err_n, 2e-3), (err_c, err_n)


def _gelu_f64(x, r):
    c2, a = 2 * np.sqrt(2 / np.pi), 0.044715
    with np.errstate(over="ignore"):  # exp(+large) = inf: the sigmoid is then exactly 0
        s = 1 / (1 + np.exp(-c2 * (x + a * x ** 3)))
    return [r * (s + x * s * (1 - s) * c2 * (1 + 3 * a * x ** 2))]


def _layernorm_f64(x, r, gamma):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + 1e-7)
    xhat, g = xc * rstd, r * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return [dx, (r * xhat).sum((0, 1)), r.sum((0, 1))]


def test_composed_gelu_has_no_parameters_and_rejects_unknown_forms():
    assert ComposedGELU(nn.GELU()).trainable_params() == []
    with pytest.raises(ValueError, match="`form` must be one of"):
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
            assert [(r["layer"], r["choice"]) for r in table] == [
                (f"layers.{i}.{name}", "composed") for i in (0, 1) for name in ("ln1", "ff.1", "ln2")]
            assert [(type(layer.ln1).__name__, type(layer.ff[1]).__name__, type(layer.ln2).__name__)
                    for layer in net.layers] == [("ComposedLayerNorm", "ComposedGELU", "ComposedLayerNorm")] * 2
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


def test_decisions_are_measured_per_shape_cached_and_reused(tmp_path):
    from mindstep.optimize import gelu, layernorm

    ids = np.ones((2, 8), np.int32)
    table = optimize(_bert(), (ids,), cache_dir=str(tmp_path))
    cache = json.loads((tmp_path / "decisions.json").read_text())
    # both GeLUs see the same (2, 8, 32) input, all four LayerNorms (2, 8, 16): one measurement each, the
    # other layers read it from the cache
    head = f"CPU|mindspore-{ms.__version__}|"
    assert sorted(cache) == [f"{head}{gelu.FORMULATION}|gelu tanh|in(2, 8, 32) Float32",
                             f"{head}{layernorm.FORMULATION}|layernorm 16 eps1e-07|in(2, 8, 16) Float32"]
    for entry in cache.values():
        assert set(entry["times"]) == {"native", "composed"} and entry["choice"] in ("native", "composed")
    assert [(r["config"].split()[0], r.get("cached")) for r in table] == [
        ("layernorm", False), ("gelu", False), ("layernorm", True),
        ("layernorm", True), ("gelu", True), ("layernorm", True)]
    assert all("measured fwd+bwd" in r["reason"] for r in table)
    again = optimize(_bert(), (ids,), cache_dir=str(tmp_path), measure=False)
    assert [r["choice"] for r in again] == [r["choice"] for r in table]
    erf = nn.SequentialCell(nn.Dense(4, 4), nn.GELU(approximate=False))
    optimize(erf, (np.ones((3, 4), np.float32),), cache_dir=str(tmp_path))
    keys = list(json.loads((tmp_path / "decisions.json").read_text()))
    assert any("|gelu none|in(3, 4) Float32" in k for k in keys)


def test_a_gelu_or_layernorm_form_must_beat_native_by_the_margin(monkeypatch):
    from mindstep.optimize import decide, layernorm

    assert decide.choose({"native": 2.2, "composed": 2.1}, {"native": 0, "composed": 2}, decide.KIND_MARGIN) == "native"
    assert decide.choose({"native": 2.4, "composed": 2.1}, {"native": 0, "composed": 2}, decide.KIND_MARGIN) == "composed"
    # a tie as measured: native stays, and the reason says why
    monkeypatch.setattr(decide._Timed, "time", lambda self, repeats=7, stop_above=None: (
        2.1 if isinstance(self.probe.layer, ComposedLayerNorm) else 2.2))
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert row["choice"] == "native" and "no form is 1.1x faster" in row["reason"], row


def test_what_stays_native_says_why(tmp_path):
    class MyGELU(nn.GELU):  # a subclass may compute something else: not rewritten
        pass

    net = nn.SequentialCell(nn.Dense(4, 4), MyGELU(), nn.GELU(), nn.LayerNorm((4,)))
    table = optimize(net, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), device="GPU")
    assert [(r["layer"], r["choice"]) for r in table] == [("2", "native"), ("3", "native")]
    assert all("fast on GPU" in r["reason"] for r in table)
    two_axes = nn.SequentialCell(nn.LayerNorm((3, 4), begin_norm_axis=1, begin_params_axis=1))
    table = optimize(two_axes, (np.ones((2, 3, 4), np.float32),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "more than the last axis" in table[0]["reason"]
    double = nn.SequentialCell(nn.GELU())
    table = optimize(double, (np.ones((2, 4), np.float64),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "Float64" in table[0]["reason"] and type(double[0]) is nn.GELU
    conv_form = nn.SequentialCell(nn.GELU())  # a conv form forced on a GELU gives its one form
    table = optimize(conv_form, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), force={"*": "one-gemm"})
    assert table[0]["choice"] == "composed" and type(conv_form[0]) is ComposedGELU
