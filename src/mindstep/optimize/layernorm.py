"""`nn.LayerNorm` over the last axis with a backward written as matrix-vector products.

Why: MindSpore 2.10's CPU `LayerNormGrad` was 14 % of the bench BERT's composed step on this project's
AMD EPYC (after the composed GeLU). The forward stays MindSpore's `LayerNorm` kernel (fast); the
backward recomputes the normalised input and takes every reduction as a product with a vector:

    xhat = (x - mean) * rstd,  g = dy * gamma
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum_rows(dy * xhat),  dbeta = sum_rows(dy)

(`mean` over the last axis = times a (H, 1) vector of 1/H; `sum_rows` = a (1, rows) vector of ones
times the (rows, H) matrix). Forward + backward in GRAPH_MODE, medians of 11 calls on the AMD EPYC:
(16, 64, 128) native 2.25 ms, composed 2.14 ms; (16, 64, 768) 13.6 vs 10.3 ms; `decide` measures per
shape. Only the common case is composed: one normalised axis, the last, with gamma and beta over it,
float32 or float16 input (the backward then runs in float32 and casts its results back).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from .._errors import bad_value

FORMS = ("composed",)
FORMULATION = "layernorm-2"  # bumped whenever the composed form changes (see `decide.FORMULATION`)

_MM = ops.MatMul()


class _LayerNormFn(nn.Cell):
    """MindSpore's LayerNorm forward over the last axis; the backward as in the module docstring."""

    def __init__(self, width: int, epsilon: float):
        super().__init__()
        self.width, self.epsilon = width, epsilon
        self.norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=epsilon)
        self.mean_vec = Tensor(np.full((width, 1), 1.0 / width, np.float32))

    def construct(self, x, gamma, beta):
        return self.norm(x, gamma, beta)[0]

    def bprop(self, x, gamma, beta, out, dout):
        # in float32 whatever the input's float type (mixed precision gives float16), results in theirs
        f32 = mstype.float32
        x2 = ops.cast(x, f32).reshape(-1, self.width)
        dy = ops.cast(dout, f32).reshape(-1, self.width)
        xc = x2 - _MM(x2, self.mean_vec)
        rstd = ops.rsqrt(_MM(xc * xc, self.mean_vec) + self.epsilon)
        xhat = xc * rstd
        g = dy * ops.cast(gamma, f32)
        dx = rstd * (g - _MM(g, self.mean_vec) - xhat * _MM(g * xhat, self.mean_vec))
        ones = ops.ones((1, x2.shape[0]), f32)
        dgamma = _MM(ones, dy * xhat).reshape(gamma.shape)
        dbeta = _MM(ones, dy).reshape(beta.shape)
        return ops.cast(dx.reshape(x.shape), x.dtype), ops.cast(dgamma, gamma.dtype), ops.cast(dbeta, beta.dtype)


class ComposedLayerNorm(nn.Cell):
    """An `nn.LayerNorm` over the last axis with the backward above; keeps the layer's own `gamma` and
    `beta` Parameters (identity and names), the same function within float tolerance."""

    def __init__(self, layer: nn.LayerNorm, form: str = "composed"):
        super().__init__(auto_prefix=False)  # auto_prefix would rename the layer's Parameters
        if form not in FORMS:
            raise bad_value("form", form, f"one of {FORMS}", "Omit `form`: the layer has one composed form.")
        self.form = form
        self.gamma, self.beta = layer.gamma, layer.beta
        self.fn = _LayerNormFn(int(layer.normalized_shape[0]), float(layer.epsilon))

    def construct(self, x):  # as nn.LayerNorm: gamma and beta in the input's float type
        return self.fn(x, self.gamma.astype(x.dtype), self.beta.astype(x.dtype))


def matches(cell) -> bool:
    """The exact `nn.LayerNorm` class: a subclass may compute something else in its `construct`."""
    return type(cell) is nn.LayerNorm


def supported(layer: nn.LayerNorm, shape: tuple, dtype) -> tuple[bool, str]:
    import mindspore as ms

    last = len(shape) - 1
    if len(layer.normalized_shape) != 1 or layer.begin_norm_axis not in (-1, last) \
            or layer.begin_params_axis not in (-1, last):
        return False, ("normalises more than the last axis (normalized_shape "
                       f"{tuple(layer.normalized_shape)}, begin_norm_axis {layer.begin_norm_axis}): no composed form")
    if dtype not in (ms.float32, ms.float16) or layer.gamma.dtype != ms.float32:
        return False, f"{dtype} input ({layer.gamma.dtype} gamma): the composed LayerNorm is built for float32 " \
                      "and float16 inputs with float32 parameters"
    return True, ""


def config(layer: nn.LayerNorm) -> str:
    return f"layernorm {int(layer.normalized_shape[0])} eps{layer.epsilon:g}"


def build(layer: nn.LayerNorm, form: str) -> nn.Cell:
    return ComposedLayerNorm(layer, form)


def extra_mb(shape: tuple) -> float:
    """Extra memory (MB, fp32) the composed form may add to a step, as an upper bound: the backward's
    temporaries (the centred and normalised input, gamma times dY, and two products) alive at once,
    five arrays of the input's size; the forward keeps the input, as the native layer does (which
    also keeps its mean and variance)."""
    return 4.0 * 5 * int(np.prod(shape)) / 2**20
