"""Measured, cached choice between a native layer and its composed form.

For each distinct (layer configuration, input shape) the pass times forward + input and weight
gradients of both forms on the actual device, in GRAPH_MODE like the training step, keeps the faster
one, and stores the decision in a JSON file keyed by device, MindSpore version and shape, so the
measurement runs once per machine. On devices whose native convolutions are fast (GPU, Ascend) the
layers are left native without measuring.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn

from .._compile import graph_mode
from .conv import FORMS, GemmConv2d, conv_pads

NATIVE_FAST_DEVICES = ("GPU", "Ascend")
# Bumped whenever the composed forms change, so cached decisions measured on old code are not reused.
FORMULATION = "gemmconv-6"
# A form that needs more memory must be this much faster than the leaner one to be chosen: a layer
# timed alone does not show the cost of its extra buffers inside a whole training graph (rrdbnet:
# one-GEMM layers won alone by 1.2x, yet the whole step ran faster and 1.9x leaner with batched).
MEMORY_MARGIN = 1.25


def cache_path(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("MINDSTEP_CACHE_DIR") or os.path.join(Path.home(), ".cache", "mindstep")
    return Path(root) / "decisions.json"


def load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_cache(path: Path, cache: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written cache


def key(device: str, conv: nn.Conv2d, shape: tuple, dtype) -> str:
    pads = conv_pads(conv, shape[2], shape[3])
    return (f"{device}|mindspore-{ms.__version__}|{FORMULATION}|conv2d {conv.in_channels}->{conv.out_channels} "
            f"k{conv.kernel_size} s{conv.stride} d{conv.dilation} pads{pads} bias{int(conv.has_bias)}"
            f"|in{tuple(shape)} {dtype}")


def extra_mb(conv: nn.Conv2d, shape: tuple, form: str = "batched") -> float:
    """Estimated extra memory (MB, fp32) of a composed form over the native layer.

    Both forms hold the im2col columns of x (forward and weight gradient) and of the padded output
    gradient (input gradient). `batched` also broadcasts W across the batch; `one-gemm` also
    materialises a transposed copy of the columns and of the output.
    """
    n, c, h, w = shape
    kh, kw = conv.kernel_size
    k = conv.out_channels
    if (kh, kw) == (1, 1) and conv.stride == (1, 1):
        return 0.0
    t, b, l, r = conv_pads(conv, h, w)
    ho = (h + t + b - conv.dilation[0] * (kh - 1) - 1) // conv.stride[0] + 1
    wo = (w + l + r - conv.dilation[1] * (kw - 1) - 1) // conv.stride[1] + 1
    cols_x = n * c * kh * kw * ho * wo
    cols_dy = n * k * kh * kw * (h + t + b) * (w + l + r)
    if form == "one-gemm":
        extra = cols_x + cols_dy + n * k * ho * wo
    else:
        extra = n * k * c * kh * kw * 2  # W and its flipped transpose, broadcast over the batch
    return 4.0 * (cols_x + cols_dy + extra) / 2**20


def choose(times: dict, memory: dict) -> str:
    """The fastest form, except that a form needing more memory must beat a leaner, faster-than-
    native form by MEMORY_MARGIN."""
    candidates = sorted((f for f in times if times[f] < times["native"]), key=lambda f: memory[f])
    if not candidates:
        return "native"
    best = candidates[0]
    for form in candidates[1:]:
        if times[form] * MEMORY_MARGIN <= times[best]:
            best = form
    return best


class _Probe(nn.Cell):
    def __init__(self, layer):
        super().__init__(auto_prefix=False)  # auto_prefix would rename the layer's Parameters
        self.layer = layer
        self.grad = ms.grad(self._loss, grad_position=0, weights=layer.trainable_params())

    def _loss(self, x):
        return self.layer(x).sum()

    def construct(self, x):
        return self.grad(x)


def time_layer(layer: nn.Cell, x, repeats: int = 3) -> float:
    """Median ms of forward + input/weight gradients, compiled in GRAPH_MODE (first call excluded)."""
    probe = _Probe(layer)
    with graph_mode():
        probe(x)[0].asnumpy()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = probe(x)
            out[0].asnumpy()
            times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def measure(conv: nn.Conv2d, shape: tuple, dtype) -> dict:
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal(shape).astype(ms.dtype_to_nptype(dtype)))
    times = {"native": time_layer(conv, x)}
    forms = ("batched",) if conv.kernel_size == (1, 1) and conv.stride == (1, 1) else FORMS
    for form in forms:
        times[form] = time_layer(GemmConv2d(conv, (shape[2], shape[3]), form), x)
    memory = {"native": 0.0, **{f: extra_mb(conv, shape, f) for f in forms}}
    choice = choose(times, memory)
    shown = ", ".join(f"{k} {v:.1f} ms/{memory[k]:.0f} MB" for k, v in times.items())
    return {"choice": choice, "native_ms": round(times["native"], 3),
            "gemm_ms": round(min(v for k, v in times.items() if k != "native"), 3),
            "extra_mb": round(memory[choice], 1), "reason": f"measured fwd+bwd: {shown}"}
