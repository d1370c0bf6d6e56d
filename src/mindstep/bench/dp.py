"""`mindstep bench --nproc N`: the data-parallel step's throughput, per rank and in total.

Each of N workers (started by `mindstep launch`) trains the bench model with `TrainStep` (jit,
`reduce="auto"`: one all-reduce per update) on its own batch of `--batch-size` samples, so the
global batch is N times that; a single process on one batch gives the baseline. Rank 0 gathers
every rank's median step time and prints the table; nothing is inferred or extrapolated, and on
a machine with fewer cores than workers the total is expected to fall short of N x the baseline.

    python -m mindstep.bench.dp --model mlp --steps 20 [--json out.json]    # a worker, or the baseline
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def measure(model: str, batch_size: int | None, image_size: int, seq_len: int, steps: int, warmup: int) -> dict:
    """This process's median step time (ms) and samples/s; every rank builds the same weights."""
    import mindspore as ms
    import numpy as np

    from ..dist import context
    from ..step import TrainStep
    from . import modes, zoo

    spec = zoo.MODELS[model]
    batch_size = batch_size or spec.default_batch
    ms.set_seed(0)
    net = spec.build(image_size, seq_len)
    loss_fn = spec.loss()
    rng = np.random.default_rng(context.rank())
    batch = tuple(ms.Tensor(a) for a in spec.batch(rng, batch_size, image_size, seq_len))

    def forward(*b):
        return loss_fn(net(b[0]), *b[1:])

    step = TrainStep(forward, modes.make_optimizer(net), nets=[net])
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        float(step(*batch)["loss"])  # synchronise before reading the clock
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms_step = statistics.median(times)
    return {"rank": context.rank(), "ms_per_step": ms_step, "samples_per_s": batch_size / ms_step * 1e3,
            "batch_size": batch_size, "world_size": context.world_size(), "reduce": step.reduce}


def gather(row: dict) -> list:
    """Every rank's row, on every rank (one AllGather of two floats)."""
    import mindspore as ms
    import numpy as np
    from mindspore import ops

    from ..dist import context

    if context.world_size() == 1:
        return [row]
    mine = ms.Tensor(np.array([[row["ms_per_step"], row["samples_per_s"]]], np.float32))
    allv = ops.AllGather()(mine).asnumpy()
    return [dict(row, rank=r, ms_per_step=float(v[0]), samples_per_s=float(v[1])) for r, v in enumerate(allv)]


def main(argv=None) -> int:
    from .._warmup import DEFAULT_WARMUP

    p = argparse.ArgumentParser(description="one data-parallel bench worker (run by `mindstep bench --nproc N`)")
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--json", metavar="PATH", help="rank 0 writes its rows here")
    args = p.parse_args(argv)
    from ..dist import context

    context.init_distributed()
    rows = gather(measure(args.model, args.batch_size, args.image_size, args.seq_len, args.steps, args.warmup))
    if context.is_main():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        for r in rows:
            print(f"rank {r['rank']}: {r['ms_per_step']:.1f} ms/step, {r['samples_per_s']:.1f} samples/s", flush=True)
    return 0


def run_nproc(flags: list, nproc: int) -> tuple[list, dict]:
    """`(per-rank rows, baseline row)`: this module once in a plain process, then on `nproc`
    workers under `mindstep launch`, both with the worker `flags` (`--model`, `--steps`, ...)."""
    import os
    import subprocess
    import tempfile

    from ..dist.launch import Job, Launch

    work = tempfile.mkdtemp(prefix="mindstep-bench-dp-")
    base_json, dp_json = os.path.join(work, "baseline.json"), os.path.join(work, "ranks.json")
    if subprocess.run([sys.executable, "-m", "mindstep.bench.dp", *flags, "--json", base_json]).returncode != 0:
        raise RuntimeError("the single-process baseline failed (see above)")
    code = Launch(Job(cmd=["python", "-m", "mindstep.bench.dp", *flags, "--json", dp_json], nproc=nproc,
                      log_dir=os.path.join(work, "logs"))).run()
    if code != 0:
        raise RuntimeError(f"the {nproc}-worker run failed (status {code}; see above)")
    with open(base_json) as fh:
        baseline = json.load(fh)[0]
    with open(dp_json) as fh:
        return json.load(fh), baseline


def report(model: str, rows: list, baseline: dict, cpu: str) -> str:
    """The table `mindstep bench --nproc N` prints."""
    n = len(rows)
    total = sum(r["samples_per_s"] for r in rows)
    lines = [f"data-parallel bench: {model}, batch {rows[0]['batch_size']} per rank, {n} workers, one all-reduce "
             f"per update ({rows[0]['reduce']})", f"CPU: {cpu}",
             f"{'':<12}{'ms/step':>10}{'samples/s':>12}"]
    lines += [f"{'rank ' + str(r['rank']):<12}{r['ms_per_step']:>10.1f}{r['samples_per_s']:>12.1f}" for r in rows]
    lines.append(f"{'total':<12}{'':>10}{total:>12.1f}")
    lines.append(f"{'1 process':<12}{baseline['ms_per_step']:>10.1f}{baseline['samples_per_s']:>12.1f}")
    lines.append(f"scaling: {total / baseline['samples_per_s']:.2f}x the single process with {n} workers "
                 f"({total / baseline['samples_per_s'] / n:.0%} of linear)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
