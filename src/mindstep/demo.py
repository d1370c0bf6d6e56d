"""`mindstep demo`: a short real training run, PyNative vs the compiled step, with measured figures."""
from __future__ import annotations

import statistics
import time

import mindspore as ms
import numpy as np
from mindspore import nn

from .models import ConvNet, seeded
from .step import TrainStep


def _data(batch: int, image: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = ms.Tensor(rng.standard_normal((batch, 3, image, image)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, batch).astype(np.int32))
    return x, y


def run_one(jit: bool, steps: int, batch: int, image: int) -> dict:
    net = seeded(ConvNet)
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, jit=jit)
    x, y = _data(batch, image)
    t0 = time.perf_counter()
    first = float(step(x, y)["loss"].asnumpy())
    first_s = time.perf_counter() - t0
    times, loss = [], first
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = float(step(x, y)["loss"].asnumpy())  # asnumpy synchronises before the clock is read
        times.append(time.perf_counter() - t0)
    return {"mode": "jit" if jit else "pynative", "first_call_s": first_s,
            "step_ms_median": 1000 * statistics.median(times),
            "samples_per_s": batch / statistics.median(times),
            "loss_first": first, "loss_last": loss, "compile_count": step.compile_count}


def run(steps: int = 20, batch: int = 32, image: int = 16) -> list[dict]:
    return [run_one(False, steps, batch, image), run_one(True, steps, batch, image)]


def render(rows: list[dict], steps: int, batch: int, image: int) -> str:
    head = (f"mindstep demo: ConvNet (2 conv blocks + BatchNorm), batch {batch}, {image}x{image} images, "
            f"Momentum, {steps} timed steps after one warm-up call, device {ms.get_context('device_target')}")
    lines = [head, f"{'mode':<9} {'first call s':>12} {'ms/step p50':>12} {'samples/s':>10} "
             f"{'loss first':>11} {'loss last':>10} {'compiles':>9}"]
    for r in rows:
        lines.append(f"{r['mode']:<9} {r['first_call_s']:>12.2f} {r['step_ms_median']:>12.2f} "
                     f"{r['samples_per_s']:>10.0f} {r['loss_first']:>11.4f} {r['loss_last']:>10.4f} "
                     f"{r['compile_count']:>9d}")
    base = rows[0]["step_ms_median"]
    lines.append(f"compiled step speed-up over PyNative: {base / rows[1]['step_ms_median']:.2f}x")
    return "\n".join(lines)
