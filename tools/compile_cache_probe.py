"""What MindSpore's own compile cache (`MS_COMPILER_CACHE_ENABLE`/`MS_COMPILER_CACHE_PATH`) does for
a mindstep step across processes, measured: the reuse, and the two ways it returns a wrong graph.

    python tools/compile_cache_probe.py

Each case runs fresh Python processes on the same cache folder and prints one RESULT line:
- `reuse`: a second process's first call against the first's (a 20-layer MLP TrainStep);
- `stale_constant`: the forward multiplies its loss by a number read at run time (a config value);
  the second process changes it, no source file changes -- does it get the first process's graph?
- `compile_order`: two steps and a smaller last batch, compiled in one order, then in another by a
  second process with the same files -- do the numbered cache entries go to the right graphs?
Losses are compared with the same process run without the cache (seeded, so equal when right).
A compile cache for mindstep steps has to be built around these facts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, os, sys, time
import numpy as np
import mindspore as ms
from mindspore import nn
import mindstep

def make(width, layers, seed):
    ms.set_seed(seed)
    net = nn.SequentialCell([nn.Dense(width, width) for _ in range(layers)])
    loss_fn = nn.MSELoss()
    scale = float(os.environ.get("PROBE_SCALE", "1"))
    def forward(x, y):
        return loss_fn(net(x), y) * scale
    return mindstep.TrainStep(forward, nn.SGD(net.trainable_params(), 1e-3))

plan = json.loads(sys.argv[1])
steps, out = {}, []
for width, batch in plan:
    if width not in steps:
        steps[width] = make(width, 20 if len(plan) == 1 else 12, width)
    x = ms.Tensor(np.ones((batch, width), np.float32)); y = ms.Tensor(np.zeros((batch, width), np.float32))
    t = time.perf_counter()
    loss = float(steps[width](x, y)["loss"])
    out.append({"shape": [width, batch], "first_call_s": round(time.perf_counter() - t, 2), "loss": loss})
print("CHILD " + json.dumps(out))
'''


def run(plan, cache=None, scale=1.0, script=None) -> list:
    """One fresh process running `plan` ([width, batch] first calls); the cache hashes the script's
    own file, so every process runs the same file (`python -c` has none and fails)."""
    env = dict(os.environ, PROBE_SCALE=str(scale), GLOG_v="3")
    env.pop("MS_COMPILER_CACHE_ENABLE", None)
    if cache:
        env.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=cache)
    done = subprocess.run([sys.executable, script or SCRIPT, json.dumps(plan)], capture_output=True, text=True,
                          env=env, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("CHILD ")), None)
    if line is None:
        raise RuntimeError(f"the probe process failed:\n{done.stderr[-2000:]}")
    return json.loads(line[6:])


SCRIPT = None


def main() -> int:
    global SCRIPT
    with tempfile.TemporaryDirectory() as tmp:
        SCRIPT = os.path.join(tmp, "probe_step.py")
        with open(SCRIPT, "w") as fh:
            fh.write(CHILD)
        one = [[64, 8]]
        first, second = run(one, f"{tmp}/reuse"), run(one, f"{tmp}/reuse")
        print(f"RESULT reuse: first process {first[0]['first_call_s']} s, second {second[0]['first_call_s']} s")
        run(one, f"{tmp}/stale", scale=1.0)
        cached, plain = run(one, f"{tmp}/stale", scale=3.0), run(one, None, scale=3.0)
        print(f"RESULT stale_constant: scale 3 with the scale-1 cache: loss {cached[0]['loss']:.6g}; "
              f"without the cache: {plain[0]['loss']:.6g} ({'STALE' if cached[0]['loss'] != plain[0]['loss'] else 'right'})")
        order = [[32, 8], [48, 8], [48, 5]]
        run(order, f"{tmp}/order")
        other = [[48, 8], [48, 5], [32, 8]]
        cached, plain = run(other, f"{tmp}/order"), run(other)
        wrong = [c["shape"] for c, p in zip(cached, plain) if c["loss"] != p["loss"]]
        print(f"RESULT compile_order: reversed order with the cache: losses {[c['loss'] for c in cached]}; without: "
              f"{[p['loss'] for p in plain]} ({'WRONG for ' + str(wrong) if wrong else 'right'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
