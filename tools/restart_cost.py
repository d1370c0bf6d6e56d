"""What a restart costs: the time from a worker's death to training again, for a `mindstep train` recipe.

    python tools/restart_cost.py --recipe resnet --repeat 3

Each repeat runs `mindstep train --recipe R --max-restarts 1 --restart-delay 0` with a checkpoint
every 50 batches and a log line every batch, SIGKILLs the training process once `batch-50` is
complete, and times, from the kill: the restarted process's "resuming from" line (a new interpreter,
imports, the recipe's data, the step built and the checkpoint loaded) and the first batch trained
after it (the compile included), read from `metrics.jsonl`. Medians and ranges over the repeats.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil


def once(recipe: str, steps: int) -> tuple[float, float]:
    out = tempfile.mkdtemp(prefix="restart_cost_")
    cmd = [sys.executable, "-m", "mindstep", "train", "--recipe", recipe, "--out", out, "--steps", str(steps),
           "--max-restarts", "1", "--restart-delay", "0", "train.save_every=50", "train.log_every=1",
           "train.eval_every=100000"]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = os.path.join(out, "ckpt", "batch-0000050.ckpt.json")
    while not os.path.exists(marker):
        if job.poll() is not None:
            raise SystemExit(f"the run ended before its checkpoint at 50:\n{job.stdout.read()[-2000:]}")
        time.sleep(0.005)
    (worker,) = [p for p in psutil.Process(job.pid).children()
                 if "mindstep.dist._run" in " ".join(p.cmdline())]
    worker.kill()
    killed = time.perf_counter()
    resumed_at = trained_at = None
    for line in job.stdout:
        if resumed_at is None and "mindstep.fit: resuming from" in line:
            resumed_at = time.perf_counter() - killed
            break
    metrics = os.path.join(out, "metrics.jsonl")
    truncated = False  # the restarted run first cuts the log back to its checkpoint (the killed one went on)
    while trained_at is None:
        try:
            with open(metrics) as fh:
                batches = [json.loads(r) for r in fh if r.strip()]
        except (OSError, ValueError):
            batches = []
        truncated = truncated or (batches and max(r.get("batch", 0) for r in batches) <= 50)
        if truncated and any(r.get("batch") == 51 and "loss" in r for r in batches):
            trained_at = time.perf_counter() - killed
        time.sleep(0.005)
    for p in psutil.Process(job.pid).children(recursive=True) + [psutil.Process(job.pid)]:
        try:
            p.kill()  # the restarted training too, not only its supervisor
        except psutil.Error:
            pass
    job.wait()
    return resumed_at, trained_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="resnet")
    parser.add_argument("--steps", type=int, default=100000, help="long enough not to end before the kill is timed")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [once(args.recipe, args.steps) for _ in range(args.repeat)]
    for i, name in enumerate(("kill -> resuming line", "kill -> first batch trained")):
        values = [r[i] for r in rows]
        print(f"{name:28s} median {statistics.median(values):5.2f} s  (min {min(values):.2f}, max {max(values):.2f}; "
              f"{len(values)} runs)")


if __name__ == "__main__":
    main()
