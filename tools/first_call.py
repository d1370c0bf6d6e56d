"""Time a training step's first call (compile + first run) in fresh processes: `mindstep.TrainStep`
against the hand-written `ms.jit(value_and_grad + optimizer)` step of the same model.

    python tools/first_call.py --models mlp,bert,resnet18 --repeat 7

Each repeat starts one fresh interpreter per variant, in alternating order, so a machine that slows
down or speeds up during the run weighs on both alike; the table gives each variant's median wall time
and its range, the median CPU time of the process (every thread; steadier than the wall clock on a
shared machine), and the ratios of the medians. The clock starts after the imports, the model, the data and the
optimizer (what both variants share) and stops when the first call's loss is on the host; `TrainStep`
is built inside the timed part. Compile times move 20-40 % between identical runs on shared machines: read
the medians, and compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

VARIANTS = ("jit", "TrainStep")

_CHILD = r"""
import json, resource, sys, time
import numpy as np, mindspore as ms
import mindstep
from mindstep.bench.modes import make_optimizer
from mindstep.bench.zoo import MODELS
name, variant, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = MODELS[name]
ms.set_seed(0)
net, loss_fn = spec.build(32, 64), spec.loss()
batch = tuple(ms.Tensor(a) for a in spec.batch(np.random.default_rng(0), spec.default_batch, 32, 64))
opt = make_optimizer(net)
net.set_train(True)
def forward(x, y):
    return loss_fn(net(x), y)
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
start, start_cpu = time.perf_counter(), cpu()
if variant == "jit":
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss
    loss = float(train_step(*batch).asnumpy())
else:
    loss = float(mindstep.TrainStep(forward, opt, **kwargs)(*batch)["loss"].asnumpy())
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": cpu() - start_cpu, "loss": loss}))
"""


def run_once(script: str, model: str, variant: str, kwargs: str = "{}") -> dict:
    env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"))
    out = subprocess.run([sys.executable, script, model, variant, kwargs], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        raise RuntimeError(f"{model} {variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,bert,resnet18", help="bench models, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per model and variant")
    parser.add_argument("--step-args", default="{}", metavar="JSON",
                        help="TrainStep keyword arguments as JSON, e.g. '{\"loss_scale\": \"dynamic\"}'")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:  # a file: MindSpore compiles only code it can read the source of
        script = os.path.join(tmp, "first_call_child.py")
        with open(script, "w") as fh:
            fh.write(_CHILD)
        return _table(script, args)


def _table(script: str, args) -> int:
    print(f"{'model':<10} {'variant':<10} {'wall s':>7} {'range':>11} {'CPU s':>7}  TrainStep / jit: wall, CPU")
    for model in args.models.split(","):
        runs = {v: [] for v in VARIANTS}
        for i in range(args.repeat):
            for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
                runs[variant].append(run_once(script, model, variant, args.step_args))
        wall = {v: statistics.median(r["seconds"] for r in rs) for v, rs in runs.items()}
        cpu = {v: statistics.median(r["cpu"] for r in rs) for v, rs in runs.items()}
        for v in VARIANTS:
            spread = f"{min(r['seconds'] for r in runs[v]):.2f}-{max(r['seconds'] for r in runs[v]):.2f}"
            ratio = (f"{wall['TrainStep'] / wall['jit']:.2f}x, {cpu['TrainStep'] / cpu['jit']:.2f}x"
                     if v == "TrainStep" else "")
            print(f"{model:<10} {v:<10} {wall[v]:>7.2f} {spread:>11} {cpu[v]:>7.2f}  {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
