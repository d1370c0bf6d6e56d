"""The GEMM ceiling at a model's own shapes (`mindstep bench --ceiling`).

MFU divides by one large GEMM (2048^2) per run. A model's convolutions and dense layers are GEMMs of
other, often much smaller, shapes, where the same MatMul kernel runs far slower (a third of its 2048^2
rate and less, docs/design/measurements.md). No im2col + GEMM formulation of those
layers (the composed-operator pass's) can run faster than their GEMMs alone, so the MFU such a step can
reach on a device is bounded by this figure, which is measured per run here.

For every `nn.Conv2d` and `nn.Dense` a forward of one sample reaches, the three GEMMs of a training
step are timed as bare MatMuls at the whole batch (no im2col, padding, layout change or any other op):
- a conv with K outputs, C inputs per group, a kh x kw kernel, G groups and N*L output positions:
  forward (K/G, C*kh*kw) x (C*kh*kw, N*L), weight gradient (K/G, N*L) x (N*L, C*kh*kw), input
  gradient (C*kh*kw, K/G) x (K/G, N*L) (columns to be folded back), each G times;
- a dense layer of I inputs, O outputs and R rows: (R, I) x (I, O), (O, R) x (R, I), (R, O) x (O, I).
Their FLOPs are the bench's counted FLOPs of those layers (3x forward). Attention's own batched
matmuls are not covered; `covered` says which share of the counted FLOPs the ceiling spans.
"""
from __future__ import annotations

import time
from collections import Counter

import mindspore as ms
import numpy as np
from mindspore import nn

from .._probe import probe_forward

# A shape is timed as the best of this many calls after its compiling one (the peak's convention: a
# ceiling is what the kernel reaches when nothing interferes), fewer once the calls add up to
# `SHAPE_SECONDS`: at ResNet-50 224 px, batch 32, one forward GEMM of the stem is ~7 GFLOP.
REPEATS = 5
SHAPE_SECONDS = 2.0
METHOD = (f"each Conv2d/Dense layer's forward, weight-gradient and input-gradient GEMMs at the whole batch as "
          f"bare fp32 MatMuls under ms.jit, the best of up to {REPEATS} calls per shape; no im2col or other op")


def gemm_shapes(net: nn.Cell, sample_inputs, batch: int) -> Counter:
    """{(m, k, n): count} of the GEMMs a training step of `net` at `batch` samples performs in its
    Conv2d and Dense layers, from one eager forward of `sample_inputs` (one sample: every counted
    layer's rows are linear in the batch)."""
    shapes = Counter()

    def conv_hook(cell, args, out):
        n, k, ho, wo = out.shape
        g = cell.group
        ckk = cell.in_channels // g * cell.kernel_size[0] * cell.kernel_size[1]
        rows = n * batch * ho * wo
        for shape in ((k // g, ckk, rows), (k // g, rows, ckk), (ckk, k // g, rows)):
            shapes[shape] += g

    def dense_hook(cell, args, out):
        rows = int(np.prod(out.shape[:-1])) * batch
        i, o = cell.in_channels, cell.out_channels
        for shape in ((rows, i, o), (o, rows, i), (rows, o, i)):
            shapes[shape] += 1

    def hook_for(cell):
        if isinstance(cell, nn.Conv2d):
            return conv_hook
        return dense_hook if isinstance(cell, nn.Dense) else None

    probe_forward([net], hook_for, lambda: net(*sample_inputs))
    return shapes


def _matmul(a, b):
    return ms.ops.matmul(a, b)


def time_gemm(m: int, k: int, n: int, repeats: int = REPEATS, max_seconds: float = SHAPE_SECONDS) -> float:
    """Best seconds of an fp32 (m, k) x (k, n) MatMul under ms.jit over up to `repeats` calls after
    the compiling one (fewer once they add up to `max_seconds`)."""
    rng = np.random.default_rng(0)
    a = ms.Tensor(rng.standard_normal((m, k)).astype(np.float32))
    b = ms.Tensor(rng.standard_normal((k, n)).astype(np.float32))
    mm = ms.jit(_matmul)
    mm(a, b).asnumpy()
    times = []
    while len(times) < repeats and sum(times) < max_seconds:
        t0 = time.perf_counter()
        mm(a, b).asnumpy()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(net: nn.Cell, sample_inputs, batch: int, counted_flops: float) -> dict:
    """The ceiling of `net`'s step at `batch` samples: its Conv2d/Dense GEMMs' FLOPs (`flops`), the
    seconds they take as bare MatMuls (`seconds`, summed over every GEMM a step runs), their rate
    (`gflops`), how many distinct shapes were timed (`shapes`), and the share of `counted_flops`
    (the bench's FLOPs per step) they cover (`covered`)."""
    shapes = gemm_shapes(net, sample_inputs, batch)
    if not shapes:
        return {"flops": 0.0, "seconds": 0.0, "gflops": float("nan"), "shapes": 0, "covered": 0.0,
                "method": METHOD}
    flops = seconds = 0.0
    for (m, k, n), count in shapes.items():
        flops += 2.0 * m * k * n * count
        seconds += time_gemm(m, k, n) * count
    return {"flops": flops, "seconds": seconds, "gflops": flops / seconds / 1e9, "shapes": len(shapes),
            "covered": flops / counted_flops if counted_flops > 0 else float("nan"), "method": METHOD}
