"""Per-tensor work in the step graph goes through one `HyperMap`, never a Python loop.

MindSpore's graph compiler unrolls a Python `for` over a tuple of gradients into one set of nodes
per tensor, and each set is compiled on its own. One `HyperMap` compiles the per-tensor function
once per distinct signature. Measured on ResNet-18's 62 gradient tensors (MindSpore 2.10 CPU,
Intel Xeon @ 2.00GHz, AVX-512), global-norm clipping alone in a graph: unrolled loop 13.4 s to
compile and +296 MB peak RSS, HyperMap 2.5 s and +77 MB, the same result.
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


def zero(x):
    """Assign zeros (+0.0) to the Parameter `x`, whatever it holds (NaN and Inf included): a scalar
    zero broadcast into it (`InplaceCopy`), no temporary of `x`'s size.

    Not `zeros_like(x)`: MindSpore 2.10 folds that into a constant the size of `x` in the graph, so
    resetting ResNet-18's accumulators in the update graph cost 142 MB of RSS where `x - x` (zero for
    every finite value) mapped through `nan_to_num` (zero for the rest) cost 53 (measured, AMD EPYC;
    45 MB of either is the optimizer's momentum, first touched there), and three kernels per tensor
    (`Sub`, `NanToNum`, `Assign`; profiled, `NanToNum` alone 2.7 % of a ResNet-18 step with every
    pipeline feature on, AMD EPYC family 23 model 1). Runs eagerly too."""
    return _COPY_INTO(x, ms.Tensor(0.0, x.dtype))


def mul(factor, g):
    """`g * factor` (MindSpore's type promotion)."""
    return g * factor


def scale_into(factor, p):
    """`p * factor` in p's dtype, written into the Parameter `p` (`InplaceMul`: the same product).

    Compiled graphs only: MindSpore 2.10's CPU wheel has no eager `InplaceMul` kernel ("The kernel
    InplaceMul unregistered"), so an eager step takes the copying path (`StepGraph.in_place`).
    Written as `assign(p, p * factor)`, MindSpore 2.10 copies `p` (`TensorMove`) before the product
    in each graph or branch that does it: the update graph of a ResNet-18 step with every pipeline
    feature on held 124 such copies (unscale and clip), and its peak RSS was ~20 MB higher
    (measured, AMD EPYC family 25 model 17)."""
    return _MUL_INTO(p, factor.astype(p.dtype))


def scale(factor, g):
    """`g * factor` in g's dtype."""
    return g * factor.astype(g.dtype)


def _matrix(g):
    """`g` viewed as a matrix, rows its first axis (a vector or a scalar as one row)."""
    return g.reshape(g.shape[0], -1) if g.ndim > 2 else (g if g.ndim == 2 else g.reshape(1, -1))


def square_sum(g):
    """The float32 sum of squares of `g`: its squares, as a matrix (`_matrix`), times a vector of
    ones, summed. MindSpore 2.10's CPU `ReduceSum` over a whole tensor is slow: over five tensors of
    3.3 M elements (ResNet layer shapes, AMD EPYC family 23 model 1, GRAPH_MODE) `square` + `sum`
    took 22.4 ms, this 5.2 ms (relative error against float64 2.4e-7, 2.6e-8 before); profiled, the
    `ReduceSum`s of the global norm were 9 % of a ResNet-18 step with every pipeline feature on."""
    m = _matrix(g.astype(ms.float32))
    return ops.matmul(m * m, ops.ones((m.shape[1], 1), ms.float32)).sum()


def all_finite(g):
    return ops.isfinite(g).all()


def nonfinite_mark(g):
    """A float32 scalar that is 0 exactly when every element of `g` is finite.

    `g`, viewed as a matrix (rows: its first axis), times a zero vector, summed: each product of a
    finite value and 0 is +-0, of inf or NaN and 0 is NaN, so nothing can overflow. One
    matrix-vector product, which CPUs run multi-threaded near memory speed, where `isfinite` +
    `all` are two elementwise passes and MindSpore 2.10's CPU `ReduceAll` is slow: over ResNet-18's
    20 conv weights (11.2 M elements, AMD EPYC, 2 cores) 4.6 ms as products, 26.7 ms as
    `isfinite().all()`, 40 ms as a `min` or `sum` of `isfinite`; profiled, `ReduceAll` was 29 % of
    the composed ResNet-18 step (jit-opt 87 -> 62 ms/step with the products). Flattening a conv
    weight costs a copy of it inside the step (ResNet-18 `jit` peak 802 -> 822 MB; `jit-opt` and the
    accumulating step's update graph, within 15 MB)."""
    m = _matrix(g)
    return ops.matmul(m, ops.zeros((m.shape[1], 1), g.dtype)).sum().astype(ms.float32)


def clamp(limit, g):
    return ops.clamp(g, -limit, limit)


def clamp_into(limit, p):
    """Clamp the Parameter `p` to [-limit, limit] in place."""
    return ops.assign(p, ops.clamp(p, -limit, limit))


def follow(decay, shadow, param):
    """EMA: `shadow <- decay * shadow + (1 - decay) * param`, in place."""
    return ops.assign(shadow, shadow * decay + param * (1.0 - decay))
