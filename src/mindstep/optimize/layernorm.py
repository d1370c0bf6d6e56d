"""`nn.LayerNorm` over the last axis as elementwise kernels and matrix-vector products (or reductions).

Why: MindSpore 2.10's CPU `LayerNorm` and `LayerNormGrad` kernels are slow next to the elementwise
and GEMM kernels the same arithmetic can be written in (docs/design/measurements.md). Each form
recomputes from the layer's input:

    mean = x times a (H, 1) vector of 1/H,  xc = x - mean,  rstd = rsqrt(mean(xc * xc) + eps)
    y = xc * rstd * gamma + beta
    xhat = xc * rstd,  g = dy * gamma
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum_rows(dy * xhat),  dbeta = sum_rows(dy)

(`sum_rows` = a (1, rows) vector of ones times the (rows, H) matrix: one GEMM, no reduction kernel).

Forms (`FORMS`, per direction as for convs): ``"composed"`` computes the forward as above too;
``"native-fwd"`` keeps MindSpore's own forward kernel and only the backward is composed (where the
native forward is fast and only its gradient is slow). `decide` times both against native per
input shape and keeps a form only when it is `decide.KIND_MARGIN` faster: where the native kernels
are level the layers stay native, and the step keeps their memory.

A third form, ``"reduce"``, is the same arithmetic with the row means and the column sums taken by
reduction kernels (`ReduceMean`, `ReduceSum`) instead of matrix-vector products: graph-kernel fusion
(`optimize={'fuse': True}`) fuses reductions with the elementwise kernels around them, where each
product is a `MatMul` launch of its own (the fused bench BERT step, "composed", ran 24 of its 51
`MatMul`s for its four LayerNorms; the timings: docs/design/measurements.md).

Only the common case is composed: one normalised axis, the last, with gamma and beta over it, float32
or float16 input (the arithmetic then runs in float32 and the results are cast back).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from .._errors import bad_value

FORMS = ("composed", "native-fwd", "reduce")
FORMULATION = "layernorm-4"  # bumped whenever a composed form changes (see `decide.FORMULATION`)

_MM = ops.MatMul()
_ROW_MEAN = ops.ReduceMean(keep_dims=True)
_COLUMN_SUM = ops.ReduceSum(keep_dims=False)


class _LayerNormFn(nn.Cell):
    """LayerNorm over the last axis of `x` with `gamma`, `beta`: the forward composed or MindSpore's
    (`native_forward`), the backward composed (see the module docstring)."""

    def __init__(self, width: int, epsilon: float, native_forward: bool):
        super().__init__()
        self.width, self.epsilon, self.native_forward = width, epsilon, native_forward
        self.norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=epsilon)
        self.mean_vec = Tensor(np.full((width, 1), 1.0 / width, np.float32))

    def _row_mean(self, v):
        """The (rows, 1) means of the (rows, width) matrix `v`: a product with a vector of 1/width."""
        return _MM(v, self.mean_vec)

    def _column_sum(self, v):
        """The (1, width) sums of the (rows, width) matrix `v`: a vector of ones times it."""
        return _MM(ops.ones((1, v.shape[0]), v.dtype), v)

    def _normalised(self, x2):
        """(x - mean) and 1/std of the (rows, width) float32 matrix `x2`, per row."""
        xc = x2 - self._row_mean(x2)
        return xc, ops.rsqrt(self._row_mean(xc * xc) + self.epsilon)

    def construct(self, x, gamma, beta):
        if self.native_forward:
            return self.norm(x, gamma, beta)[0]
        f32 = mstype.float32
        xc, rstd = self._normalised(ops.cast(x, f32).reshape(-1, self.width))
        y = xc * rstd * ops.cast(gamma, f32) + ops.cast(beta, f32)
        return ops.cast(y.reshape(x.shape), x.dtype)

    def bprop(self, x, gamma, beta, out, dout):
        # in float32 whatever the input's float type (mixed precision gives float16), results in theirs
        f32 = mstype.float32
        xc, rstd = self._normalised(ops.cast(x, f32).reshape(-1, self.width))
        dy = ops.cast(dout, f32).reshape(-1, self.width)
        xhat = xc * rstd
        g = dy * ops.cast(gamma, f32)
        dx = rstd * (g - self._row_mean(g) - xhat * self._row_mean(g * xhat))
        dgamma = self._column_sum(dy * xhat).reshape(gamma.shape)
        dbeta = self._column_sum(dy).reshape(beta.shape)
        return ops.cast(dx.reshape(x.shape), x.dtype), ops.cast(dgamma, gamma.dtype), ops.cast(dbeta, beta.dtype)


class _ReducedLayerNormFn(_LayerNormFn):
    """`_LayerNormFn` (composed forward) with its means and sums by reduction kernels (the "reduce"
    form, see the module docstring). A class of its own, not a flag: a branch inside a custom bprop
    does not compile in MindSpore 2.10 (see `conv._correlate_t`)."""

    def _row_mean(self, v):
        return _ROW_MEAN(v, -1)

    def _column_sum(self, v):
        return _COLUMN_SUM(v, 0)


class ComposedLayerNorm(nn.Cell):
    """An `nn.LayerNorm` over the last axis in one of `FORMS`; keeps the layer's own `gamma` and `beta`
    Parameters (identity and names), the same function within float tolerance."""

    def __init__(self, layer: nn.LayerNorm, form: str = "composed"):
        super().__init__(auto_prefix=False)  # auto_prefix would rename the layer's Parameters
        if form not in FORMS:
            raise bad_value("form", form, f"one of {FORMS}",
                            "Use 'composed' (forward and backward composed), 'native-fwd' (MindSpore's "
                            "forward, the backward composed) or 'reduce' (composed, with reduction kernels), "
                            "or omit `form`.")
        self.form = form
        self.gamma, self.beta = layer.gamma, layer.beta
        fn = _ReducedLayerNormFn if form == "reduce" else _LayerNormFn
        self.fn = fn(int(layer.normalized_shape[0]), float(layer.epsilon), form == "native-fwd")

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
    if dtype not in (ms.float32, ms.float16) or layer.gamma.dtype != ms.float32 or layer.beta.dtype != ms.float32:
        return False, (f"{dtype} input ({layer.gamma.dtype} gamma): the composed LayerNorm is built for float32 "
                       "and float16 inputs with float32 parameters")
    return True, ""


def config(layer: nn.LayerNorm) -> str:
    return f"layernorm {int(layer.normalized_shape[0])} eps{layer.epsilon:g}"


def build(layer: nn.LayerNorm, form: str) -> nn.Cell:
    return ComposedLayerNorm(layer, form)


def extra_mb(shape: tuple) -> float:
    """Extra memory (MB, fp32) a composed form may add to a step, as an upper bound: the backward's
    temporaries (the centred and normalised input, gamma times dY, and two products) alive at once,
    five arrays of the input's size; the forward keeps the input only, as the native layer does (which
    also keeps its mean and variance)."""
    return 4.0 * 5 * int(np.prod(shape)) / 2**20
