"""Composed GeLU (`mindstep.optimize.gelu`): equals nn.GELU in both `approximate` forms (forward and
input gradient, PyNative and GRAPH_MODE, over a grid of shapes and values up to the saturated tails,
float16 inputs too); a rewritten BERT (GeLUs and LayerNorms composed) trains to the same parameters
as the native one; decisions are measured per shape under their own cache key and reused; a form must
beat native by a margin; what stays native says why."""
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


def test_float16_inputs_are_computed_in_float32_and_come_back_in_float16():
    # mixed precision hands the layer float16; the composed form computes in float32 inside, so its
    # gradient is at least as near the float64 result as native's float16 kernel
    rng = np.random.default_rng(0)
    x64 = 3.0 * rng.standard_normal((4, 6, 32))
    x64.reshape(-1)[:2] = [60.0, -300.0]  # float16's x^3 and x^2 would overflow here
    r64 = rng.standard_normal((4, 6, 32))
    native = nn.GELU()
    x, r = ms.Tensor(x64.astype(np.float16)), ms.Tensor(r64.astype(np.float32))

    def results(layer):
        def loss(x):
            return (layer(x).astype(ms.float32) * r).sum()

        return layer(x), ms.grad(loss)(x)

    (_, dx_n), (out_c, dx_c) = results(native), results(ComposedGELU(native))
    assert out_c.dtype == ms.float16 and dx_c.dtype == ms.float16
    want = _gelu_f64(x.asnumpy().astype(np.float64), r64)
    err_c = np.abs(dx_c.asnumpy().astype(np.float64) - want).max() / np.abs(want).max()
    err_n = np.abs(dx_n.asnumpy().astype(np.float64) - want).max() / np.abs(want).max()
    assert np.isfinite(dx_c.asnumpy()).all() and err_c <= max(1.05 * err_n, 2e-3), (err_c, err_n)


def _gelu_f64(x, r):
    """The tanh GeLU's input gradient for output weights r, in float64."""
    c2, a = 2 * np.sqrt(2 / np.pi), 0.044715
    with np.errstate(over="ignore"):  # exp(+large) = inf: the sigmoid is then exactly 0
        s = 1 / (1 + np.exp(-c2 * (x + a * x ** 3)))
    return r * (s + x * s * (1 - s) * c2 * (1 + 3 * a * x ** 2))


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
            # every GeLU and LayerNorm: the same parameters must come out of both composed kinds
            assert [(r["layer"], r["choice"]) for r in table] == [
                (f"layers.{i}.{name}", "composed") for i in (0, 1) for name in ("ln1", "ff.1", "ln2")]
            assert [type(layer.ff[1]).__name__ for layer in net.layers] == ["ComposedGELU"] * 2
            assert [type(layer.ln2).__name__ for layer in net.layers] == ["ComposedLayerNorm"] * 2
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
    from mindstep.optimize import decide, gelu

    ids = np.ones((2, 8), np.int32)
    table = [r for r in optimize(_bert(), (ids,), cache_dir=str(tmp_path)) if r["config"].startswith("gelu")]
    cache = {k: v for k, v in json.loads((tmp_path / "decisions.json").read_text()).items() if "|gelu" in k}
    # both layers see the same (2, 8, 32) input: one measurement, the second layer reads it from the cache
    assert list(cache) == [f"CPU|mindspore-{ms.__version__}|{decide.KIND_TIMING}|{gelu.FORMULATION}|gelu tanh|"
                           "in(2, 8, 32) Float32"]
    entry = next(iter(cache.values()))
    assert set(entry["times"]) == {"native", "composed"} and entry["choice"] in ("native", "composed")
    assert [r.get("cached") for r in table] == [False, True]
    assert all(r["config"] == "gelu tanh" and "measured fwd+bwd" in r["reason"] for r in table)
    again = [r for r in optimize(_bert(), (ids,), cache_dir=str(tmp_path), measure=False)
             if r["config"].startswith("gelu")]
    assert [r["choice"] for r in again] == [r["choice"] for r in table]
    erf = nn.SequentialCell(nn.Dense(4, 4), nn.GELU(approximate=False))
    optimize(erf, (np.ones((3, 4), np.float32),), cache_dir=str(tmp_path))
    keys = list(json.loads((tmp_path / "decisions.json").read_text()))
    assert any("|gelu none|in(3, 4) Float32" in k for k in keys)


def test_a_gelu_form_must_beat_native_by_the_margin(monkeypatch):
    from mindstep.optimize import decide, gelu

    assert decide.choose({"native": 2.2, "composed": 2.1}, {"native": 0, "composed": 2}, decide.KIND_MARGIN) == "native"
    assert decide.choose({"native": 2.4, "composed": 2.1}, {"native": 0, "composed": 2}, decide.KIND_MARGIN) == "composed"
    # a near tie as measured: native stays, and the reason says why
    monkeypatch.setattr(decide._Timed, "time", lambda self, repeats=7, stop_above=None, fresh=False: (
        2.1 if isinstance(self.probe.layer, ComposedGELU) else 2.2))
    row = decide.measure_kind(gelu, nn.GELU(), (2, 3, 8), ms.float32)
    assert row["choice"] == "native" and "no form is 1.1x faster" in row["reason"], row


def test_what_stays_native_says_why(tmp_path):
    class MyGELU(nn.GELU):  # a subclass may compute something else: not rewritten
        pass

    net = nn.SequentialCell(nn.Dense(4, 4), MyGELU(), nn.GELU())
    table = optimize(net, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), device="GPU")
    assert [(r["layer"], r["choice"]) for r in table] == [("2", "native")]
    assert "fast on GPU" in table[0]["reason"]
    double = nn.SequentialCell(nn.GELU())
    table = optimize(double, (np.ones((2, 4), np.float64),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "Float64" in table[0]["reason"] and type(double[0]) is nn.GELU
    conv_form = nn.SequentialCell(nn.GELU())  # a conv form forced on a GELU gives its one form
    table = optimize(conv_form, (np.ones((2, 4), np.float32),), cache_dir=str(tmp_path), force={"*": "one-gemm"})
    assert table[0]["choice"] == "composed" and type(conv_form[0]) is ComposedGELU
