"""Per-tensor work in the step graph goes through one `HyperMap`, never a Python loop.

MindSpore's graph compiler unrolls a Python `for` over a tuple of gradients into one set of nodes
per tensor, and each set is compiled on its own. One `HyperMap` compiles the per-tensor function
once per distinct signature: 5x faster to compile and a quarter of the memory on ResNet-18's
gradients (docs/design/measurements.md).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

from mindspore.ops import auto_generate as _generated

MAP = ops.HyperMap()
# MindSpore's in-place primitives: in a graph they write the Parameter without the copy (`TensorMove`)
# of its old value that MindSpore 2.10 inserts before an `assign(p, f(p))` (see `scale_into`)
_COPY_INTO = _generated.InplaceCopy()
_MUL_INTO = _generated.InplaceMul()
# Primitives, not Tensor methods (`t.sum()`, `t.astype()`): the graph compiler resolves a Tensor
# method through MindSpore's overload tables for every gradient shape it meets, which made the
# finite check's compile cost grow with the number of gradients (see `nonfinite_mark`).
_SUM = ops.ReduceSum()
CAST = ops.Cast()
_MUL = ops.Mul()


def zero(x):
    """Assign zeros (+0.0) to the Parameter `x`, whatever it holds (NaN and Inf included): a scalar
    zero broadcast into it (`InplaceCopy`), no temporary of `x`'s size.

    Not `zeros_like(x)`, which MindSpore 2.10 folds into a constant the size of `x`, nor `x - x`
    through `nan_to_num` (three kernels per tensor); see docs/design/measurements.md. Runs eagerly
    too."""
    return _COPY_INTO(x, ms.Tensor(0.0, x.dtype))


def mul(factor, g):
    """`g * factor` (MindSpore's type promotion)."""
    return g * factor


def scale_into(factor, p):
    """`p * factor` in p's dtype, written into the Parameter `p` (`InplaceMul`: the same product).

    Compiled graphs only: MindSpore 2.10's CPU wheel has no eager `InplaceMul` kernel ("The kernel
    InplaceMul unregistered"), so an eager step takes the copying path (`StepGraph.in_place`).
    Written as `assign(p, p * factor)`, MindSpore 2.10 copies `p` (`TensorMove`) before the product
    in each graph or branch that does it (docs/design/measurements.md)."""
    return _MUL_INTO(p, factor.astype(p.dtype))


def scale(factor, g):
    """`g * factor` in g's dtype."""
    return g * factor.astype(g.dtype)


def _total(t):
    """The sum of every element of `t`: a sum over the first axis, then over what is left.

    Not one `ReduceSum` over the whole tensor (MindSpore 2.10's CPU kernel for that is slow), and not
    a matrix-vector product either (each distinct `MatMul` shape holds 2-3 MB from compile on); see
    docs/design/measurements.md."""
    return _SUM(_SUM(t, 0)) if t.ndim >= 2 else _SUM(t)


def square_sum(g):
    """The float32 sum of squares of `g` (see `_total` for how it is summed; relative error against
    float64 3.4e-8 over ResNet-18's weights)."""
    g = CAST(g, ms.float32)
    return _total(_MUL(g, g))


def all_finite(g):
    return ops.isfinite(g).all()


def nonfinite_mark(g):
    """A float32 scalar that is 0 exactly when every element of `g` is finite.

    The sum of `g * 0`: a finite value times 0 is +-0, inf or NaN times 0 is NaN, so nothing can
    overflow (a sum of `g` itself could reach inf from finite values). A product and two sums
    (`_total`), where `isfinite` + `all` are two elementwise passes and MindSpore 2.10's CPU
    `ReduceAll` is slow (docs/design/measurements.md)."""
    return CAST(_total(_MUL(g, 0.0)), ms.float32)


def clamp(limit, g):
    return ops.clamp(g, -limit, limit)


def clamp_into(limit, p):
    """Clamp the Parameter `p` to [-limit, limit] in place."""
    return ops.assign(p, ops.clamp(p, -limit, limit))


def follow(decay, shadow, param):
    """EMA: `shadow <- decay * shadow + (1 - decay) * param`, computed as `shadow - (1 - decay) *
    (shadow - param)` and subtracted in place (`AssignSub`).

    Written as `assign(shadow, shadow * decay + param * (1 - decay))`, MindSpore 2.10 held more
    memory in the update graph (docs/design/measurements.md). The difference form is also the more
    exact one where the two are close, as they are at every step (PyTorch's EMA helpers use it: `lerp_`)."""
    return ops.assign_sub(shadow, (shadow - param) * (1.0 - decay))
