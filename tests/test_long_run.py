"""A long run with every pipeline feature on: no recompile after the first call, no memory growth.

Not a timing test: it runs a fixed number of steps and checks the compile count and the process's
memory (RSS after 1,000 steps against the end), in a fresh interpreter so nothing else is measured.
"""
import json
import subprocess
import sys
import textwrap

import pytest

STEPS = 20_000

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np, mindspore as ms, psutil
    from mindspore import nn
    import mindstep

    steps = int(sys.argv[1])
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(16, 32), nn.BatchNorm1d(32), nn.ReLU(), mindstep.Dropout(0.1), nn.Dense(32, 4))
    opt = nn.Adam(mindstep.param_groups(net, weight_decay=1e-4), 1e-3)
    loss_fn = nn.CrossEntropyLoss()


    def forward(x, y, s):
        return loss_fn(net(x), y) * s


    step = mindstep.TrainStep(forward, opt, loss_scale="dynamic", accumulate=2, clip_grad_norm=1.0,
                              clip_grad_value=5.0, ema=0.99, lr_schedule=mindstep.schedules.sgdr(1e-3, 100, 2))
    rng = np.random.default_rng(0)
    data = [(ms.Tensor(rng.standard_normal((8, 16)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 4, 8).astype(np.int32))) for _ in range(16)]
    process = psutil.Process()
    rss, compiles = {}, {}
    for i in range(steps):
        x, y = data[i % 16]
        m = step(x, y, np.float32(np.inf if i % 997 == 5 else 1.0))  # an overflow now and then
        if i + 1 in (1, 1000, steps):
            rss[i + 1] = process.memory_info().rss / 2**20
            compiles[i + 1] = [step.compile_count, step.update_compile_count]
    print("RESULT " + json.dumps({"rss": rss, "compiles": compiles, "applied": int(m["step"]),
                                  "skipped": int(m["skipped"]), "loss": float(m["loss"])}))
''')


@pytest.mark.slow
def test_twenty_thousand_steps_with_every_feature_neither_recompile_nor_grow(tmp_path):
    script = tmp_path / "long_run.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(STEPS)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    compiles, rss = result["compiles"], result["rss"]
    assert compiles["1"] == [1, 0] and compiles[str(STEPS)] == [1, 1], compiles  # forward graph, update graph
    assert rss[str(STEPS)] <= 1.05 * rss["1000"], f"RSS grew from {rss['1000']:.0f} to {rss[str(STEPS)]:.0f} MB"
    skipped = len([i for i in range(STEPS) if i % 997 == 5])
    assert result["skipped"] == skipped and result["applied"] == STEPS // 2 - skipped
    print(f"long run: RSS {rss['1']:.0f} MB after the first step, {rss['1000']:.0f} after 1,000, "
          f"{rss[str(STEPS)]:.0f} after {STEPS:,}")
