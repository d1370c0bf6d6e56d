"""Measure `mindstep.fit` against a bare loop, and check its trackers and plateau rule on the bench's BERT.

    python tools/fit_check.py overhead --repeat 5     # fit vs `for batch in data: step(*batch)`
    python tools/fit_check.py bert                    # TensorBoard read back, ReduceLROnPlateau compiles

overhead: the bench's MLP (256-512-10, batch 64) step, compiled and warmed up first, trains over
one `mindspore.dataset` pipeline of 200 batches, alternately with a bare loop (the loss read once
at the end) and with `fit(..., log_every=20, progress=False)` (no files). The table gives each
side's median samples/s over the repeats, the spread, and the median of the per-repeat ratios.
bert: the bench's BERT MLM (batch 16, 64 tokens) trained by fit for 40 batches with a held-out
loss evaluation every 5, `ReduceLROnPlateau("loss", factor=0.5, patience=1, min_delta=0.05)` and TensorBoard; it
prints the compile count when the LR is first lowered and at the end, the reductions, and whether
every value of metrics.jsonl is in the event file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _cpu() -> str:
    from mindstep import _cpu as cpu

    return cpu.summary(cpu.describe())


def overhead(repeat: int) -> None:
    import numpy as np
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn

    import mindstep
    from mindstep.models import MLP

    rng = np.random.default_rng(0)
    x = rng.standard_normal((200 * 64, 256)).astype(np.float32)
    y = rng.integers(0, 10, 200 * 64).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64)
    ms.set_seed(0)
    net = MLP(256, 512, 10)
    step = mindstep.TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    for batch in data.create_tuple_iterator(num_epochs=1):  # compile and warm up
        float(step(*batch)["loss"])
    rates = {"bare": [], "fit": []}
    for i in range(repeat):
        for side in (("bare", "fit") if i % 2 == 0 else ("fit", "bare")):
            t0 = time.perf_counter()
            if side == "bare":
                for batch in data.create_tuple_iterator(num_epochs=1):
                    m = step(*batch)
                float(m["loss"])
            else:
                mindstep.fit(step, data, epochs=1, log_every=20, progress=False)
            rates[side].append(200 * 64 / (time.perf_counter() - t0))
    ratios = [f / b for f, b in zip(rates["fit"], rates["bare"])]
    print(f"CPU: {_cpu()}; MindSpore {ms.__version__}; {repeat} repeats, alternating")
    for side, r in rates.items():
        print(f"{side:5s} median {statistics.median(r):9.0f} samples/s  (min {min(r):.0f}, max {max(r):.0f})")
    print(f"fit / bare: median {statistics.median(ratios):.3f} (per repeat: {', '.join(f'{q:.3f}' for q in ratios)})")


def bert() -> None:
    import numpy as np
    import mindspore as ms
    from mindspore import nn

    import mindstep
    from mindstep.loop import Callback, ReduceLROnPlateau, loss
    from mindstep.loop.loggers import read_scalars
    from mindstep.models import BertMLM, MLMLoss

    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 1000, (16, 64)).astype(np.int32), rng.integers(0, 1000, (16, 64)).astype(np.int32))
               for _ in range(20)]
    ms.set_seed(0)
    net = BertMLM(max_len=64)
    step = mindstep.TrainStep.from_net(net, MLMLoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    plateau = ReduceLROnPlateau("loss", factor=0.5, patience=1, min_delta=0.05)  # random tokens: it plateaus
    seen = {}

    class Compiles(Callback):
        def on_eval(self, loop, metrics):  # after the plateau rule (callbacks run in order)
            if plateau.reductions and "first" not in seen:
                seen["first"] = step.compile_count

    out = tempfile.mkdtemp(prefix="fit_bert_")
    t0 = time.perf_counter()
    summary = mindstep.fit(step, batches[:16], steps=40, eval_data=batches[16:], eval_fn=loss(), eval_every=5,
                           out=out, log_every=5, progress=False, loggers=["tensorboard"], callbacks=[plateau, Compiles()])
    wall = time.perf_counter() - t0
    logged = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    expected = {(f"train/{k}", r["batch"]) for r in logged if "eval" not in r for k, v in r.items()
                if k != "batch" and v is not None}
    expected |= {(f"eval/{k}", r["batch"]) for r in logged if "eval" in r for k in r["eval"]}
    tb = set(read_scalars(os.path.join(out, "tb")))
    print(f"CPU: {_cpu()}; MindSpore {ms.__version__}; {summary['steps']} batches in {wall:.1f} s")
    print(f"held-out loss {summary['eval']['loss_initial']:.4f} -> {summary['eval']['loss']:.4f}; "
          f"LR reductions (batch, total factor): {[(r['batch'], r['factor']) for r in plateau.reductions]}")
    print(f"compiles: {seen.get('first')} when the LR was first lowered, {step.compile_count} at the end, after "
          f"{len(plateau.reductions)} reductions")
    print(f"TensorBoard: {len(expected)} logged values, {len(expected & tb)} in the event file, "
          f"missing: {sorted(expected - tb)[:5]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("overhead", "bert"))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    overhead(args.repeat) if args.what == "overhead" else bert()


if __name__ == "__main__":
    main()
