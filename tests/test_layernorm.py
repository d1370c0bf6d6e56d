"""Composed LayerNorm (`mindstep.optimize.layernorm`): each form equals nn.LayerNorm (forward and every
gradient, PyNative and GRAPH_MODE, over a grid of shapes and epsilons, float16 inputs too); the layer's
Parameters are kept; what is not the common case stays native and says why; decisions are measured per
shape with every form under their own cache key; a rewritten BERT trains to the same parameters as the
native one (tests/test_gelu.py, every layer forced)."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep.optimize import ComposedLayerNorm, optimize
from mindstep.optimize import decide, layernorm
from test_gelu import assert_matches_native

SHAPES = [(3, 8), (2, 5, 16), (2, 3, 4, 7)]


def _layer(width, epsilon=1e-7, seed=0):
    rng = np.random.default_rng(seed)
    layer = nn.LayerNorm((width,), epsilon=epsilon)
    layer.gamma.set_data(ms.Tensor(rng.standard_normal(width).astype(np.float32)))
    layer.beta.set_data(ms.Tensor(rng.standard_normal(width).astype(np.float32)))
    return layer


def _grads(layer, x, r):
    """[output, input gradient, gamma gradient, beta gradient] of `(layer(x) * r).sum()`."""
    def loss(x):
        return (layer(x).astype(ms.float32) * r).sum()

    dx, dps = ms.grad(loss, grad_position=0, weights=layer.trainable_params())(x)
    return [layer(x), dx, *dps]


@pytest.mark.parametrize("form", layernorm.FORMS)
@pytest.mark.parametrize("shape, epsilon", [(SHAPES[0], 1e-7), (SHAPES[1], 1e-5), (SHAPES[2], 1e-3)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"eps{v:g}")
@pytest.mark.parametrize("graph", [False, True], ids=["pynative", "graph"])
def test_composed_layernorm_equals_native_forward_and_all_gradients(form, shape, epsilon, graph):
    rng = np.random.default_rng(1)
    native = _layer(shape[-1], epsilon)
    composed = ComposedLayerNorm(native, form)
    # a large mean (a residual stream) and a row of equal values (variance 0: rstd = 1/sqrt(eps))
    x = (2.0 * rng.standard_normal(shape) + 30.0).astype(np.float32)
    x.reshape(-1, shape[-1])[0] = 5.0
    x, r = ms.Tensor(x), ms.Tensor(rng.standard_normal(shape).astype(np.float32))
    assert_matches_native(native, composed, x, r, graph, ("forward", "input gradient", "gamma", "beta"), rtol=1e-3)


def _layernorm_f64(x, r, gamma, beta, epsilon):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + epsilon)
    xhat, g = xc * rstd, r * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return [xhat * gamma + beta, dx, (r * xhat).sum(axes), r.sum(axes)]


@pytest.mark.parametrize("form", layernorm.FORMS)
def test_float16_inputs_are_computed_in_float32_and_come_back_in_float16(form):
    # mixed precision hands the layer float16; the composed forms compute in float32 inside, so each
    # result is at least as near the float64 one as native's float16 kernels
    rng = np.random.default_rng(0)
    native = _layer(32, 1e-5)
    x = ms.Tensor((3.0 * rng.standard_normal((4, 6, 32))).astype(np.float16))
    r64 = rng.standard_normal((4, 6, 32))
    r = ms.Tensor(r64.astype(np.float32))
    want = _layernorm_f64(x.asnumpy().astype(np.float64), r64, native.gamma.asnumpy().astype(np.float64),
                          native.beta.asnumpy().astype(np.float64), 1e-5)
    by_native, by_form = _grads(native, x, r), _grads(ComposedLayerNorm(native, form), x, r)
    assert by_form[0].dtype == by_form[1].dtype == ms.float16
    assert by_form[2].dtype == by_form[3].dtype == ms.float32
    for n, c, w, what in zip(by_native, by_form, want, ("forward", "input gradient", "gamma", "beta")):
        scale = np.abs(w).max()
        err_c = np.abs(c.asnumpy().astype(np.float64) - w).max() / scale
        err_n = np.abs(n.asnumpy().astype(np.float64) - w).max() / scale
        assert np.isfinite(c.asnumpy()).all() and err_c <= max(1.05 * err_n, 2e-3), (what, err_c, err_n)


def test_the_layer_keeps_its_parameters_and_rejects_unknown_forms():
    native = _layer(8)
    for form in layernorm.FORMS:
        composed = ComposedLayerNorm(native, form)
        assert [(id(p), p.name) for p in composed.trainable_params()] == \
            [(id(p), p.name) for p in native.trainable_params()]
    with pytest.raises(ValueError, match="`form` must be one of") as info:
        ComposedLayerNorm(native, "fused")
    assert "'fused'" in str(info.value) and "native-fwd" in str(info.value)


def test_what_is_not_the_common_case_stays_native_and_says_why(tmp_path):
    two_axes = nn.SequentialCell(nn.LayerNorm((4, 8), begin_norm_axis=1, begin_params_axis=1))
    table = optimize(two_axes, (np.ones((2, 4, 8), np.float32),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "more than the last axis" in table[0]["reason"]
    assert type(two_axes[0]) is nn.LayerNorm
    double = nn.SequentialCell(nn.LayerNorm((8,)))
    table = optimize(double, (np.ones((2, 8), np.float64),), cache_dir=str(tmp_path), force={"*": "composed"})
    assert table[0]["choice"] == "native" and "Float64" in table[0]["reason"]

    class MyNorm(nn.LayerNorm):  # a subclass may compute something else: not rewritten
        pass

    assert optimize(nn.SequentialCell(MyNorm((8,))), (np.ones((2, 8), np.float32),), cache_dir=str(tmp_path)) == []
    conv_form = nn.SequentialCell(nn.LayerNorm((8,)))  # a conv form forced on a LayerNorm gives its first form
    table = optimize(conv_form, (np.ones((2, 8), np.float32),), cache_dir=str(tmp_path), force={"*": "one-gemm"})
    assert table[0]["choice"] == "composed" and type(conv_form[0]) is ComposedLayerNorm
    both = nn.SequentialCell(nn.LayerNorm((8,)))
    table = optimize(both, (np.ones((2, 8), np.float32),), cache_dir=str(tmp_path), force={"*": "native-fwd"})
    assert table[0]["choice"] == "native-fwd" and both[0].form == "native-fwd"


def test_decisions_time_every_form_per_shape_and_are_cached(tmp_path):
    net = nn.SequentialCell(nn.Dense(8, 8), nn.LayerNorm((8,)), nn.Dense(8, 8), nn.LayerNorm((8,)))
    table = optimize(net, (np.ones((2, 3, 8), np.float32),), cache_dir=str(tmp_path))
    cache = json.loads((tmp_path / "decisions.json").read_text())
    # both layers see the same (2, 3, 8) input: one measurement, the second layer reads it from the cache
    assert list(cache) == [f"CPU|mindspore-{ms.__version__}|{decide.KIND_TIMING}|{layernorm.FORMULATION}|"
                           "layernorm 8 eps1e-07|in(2, 3, 8) Float32"]
    entry = next(iter(cache.values()))
    assert set(entry["times"]) == {"native", *layernorm.FORMS}
    assert "(8 calls in a row per probe, times per call)" in entry["reason"]  # a small layer: chained
    assert entry["choice"] in ("native",) + layernorm.FORMS
    assert [r.get("cached") for r in table] == [False, True]
    assert [r["choice"] for r in table] == [entry["choice"]] * 2


def test_a_form_must_beat_native_by_the_margin_and_the_faster_form_wins(monkeypatch):
    times = {"composed": 2.1, "native-fwd": 2.0, "reduce": 2.05}

    def fake_time(self, repeats=7, stop_above=None, fresh=False):
        layer = self.probe.layer
        return times[layer.form] if isinstance(layer, ComposedLayerNorm) else 2.2

    monkeypatch.setattr(decide._Timed, "time", fake_time)
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert row["choice"] == "native" and "no form is 1.1x faster" in row["reason"], row
    times.update({"composed": 1.5, "native-fwd": 1.8})
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert row["choice"] == "composed", row
    times.update({"composed": 1.8, "native-fwd": 1.5})
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert row["choice"] == "native-fwd", row
    times.update({"reduce": 1.4})
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert row["choice"] == "reduce", row


def test_small_layers_are_timed_as_a_chain_of_calls_and_large_ones_and_losses_alone(monkeypatch):
    """A few-ms layer's single probe call is mostly the probe's own overhead and moves with warm-up
    (the bench BERT's LayerNorms: kept native by single calls, 12-14 % faster in the step as `reduce`);
    chained in one graph it is timed as a step runs it. Up to `KIND_CHAIN_MAX` calls, fewer for
    larger inputs, one for a layer whose output is not its input's shape or that takes more arguments."""
    assert decide.kind_calls((16, 64, 128), (16, 64, 128)) == decide.KIND_CHAIN_MAX == 8
    assert decide.kind_calls((16, 64, 512), (16, 64, 512)) == 4
    assert decide.kind_calls((32, 512, 768), (32, 512, 768)) == 1
    assert decide.kind_calls((1024, 1000), (), (np.zeros(1024, np.int32),)) == 1  # a loss
    # the chain's gradients are the layer's, summed over its calls: a composed form still matches native
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert "left out" not in row["reason"] and set(row["times"]) == {"native", *layernorm.FORMS}, row
    assert "8 calls in a row" in row["reason"]
    # under graph-kernel fusion each probe calls the layer once: fusion merged a chain into kernels whose
    # compile ran for minutes
    monkeypatch.setattr(decide.fusion, "active", lambda: True)
    row = decide.measure_kind(layernorm, nn.LayerNorm((8,)), (2, 3, 8), ms.float32)
    assert "calls in a row" not in row["reason"], row
