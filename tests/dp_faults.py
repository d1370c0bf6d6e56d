"""Fault-tolerance cases, run as users run them: a module-level script, under `mindstep launch`
(two workers) or alone (one process).

    python tests/dp_faults.py OUT CASE [ACCUMULATE]

One training: a tiny MLP, 24 fixed batches (one epoch; two workers deal them, rank r taking batch
r of every 2), a checkpoint every 3 step calls into OUT/CASE/ckpt, the stop check every 2 (log_every).
At the end each rank writes its whole state (weights, optimizer moments, counters) to
OUT/CASE_rank<r>.npz. The CASE says what goes wrong:

- ``reference``: nothing;
- ``chaos``, under `--max-restarts 5`: five attempts. 0: a worker SIGKILLs itself before the first
  checkpoint; 1: rank 1 sends itself SIGTERM after step 5 (both ranks stop after step 6, the stop
  check, rank 0 saves, both exit 75); 2: a worker SIGKILLs itself between the checkpoints 6 and 9;
  3: rank 0 (which writes) SIGKILLs itself during the save at 9, after the payload and before its
  manifest; 4: trains to the end. The victims and moments of 0 and 2 come from a seeded generator;
- ``half``: stop cleanly after 12 batches of the epoch have been taken (the first half of an
  elastic case); ``rest``: resume whatever OUT/<the case>/ckpt holds and finish (the second half).
  The elastic cases share the folder OUT/elastic-<n> given as CASE `half:elastic-1` / `rest:elastic-1`.
Not collected by pytest; tests/test_faults.py runs it.
"""
import os
import signal
import sys

import numpy as np

import mindspore as ms
from mindspore import nn

import mindstep
from mindstep.loop import Callback

OUT, CASE = sys.argv[1], sys.argv[2]
ACCUMULATE = int(sys.argv[3]) if len(sys.argv) > 3 else 1
PART, _, FOLDER = CASE.partition(":")
FOLDER = FOLDER or CASE
rank, world = mindstep.init_distributed()
rng = np.random.default_rng(0)
BATCHES = []
for _ in range(24):
    x = rng.standard_normal((8, 4)).astype(np.float32)
    BATCHES.append((x, x.sum(1, keepdims=True).astype(np.float32)))

ms.set_seed(1)
net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))
opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
loss_fn = nn.MSELoss()


def forward(x, y):
    return loss_fn(net(x), y)


step = mindstep.TrainStep(forward, opt, accumulate=ACCUMULATE)
run = os.path.join(OUT, FOLDER)
starts = [f for f in os.listdir(OUT) if f.startswith(f"{FOLDER}_start_rank{rank}_")] if os.path.isdir(OUT) else []
attempt = len(starts)
open(os.path.join(OUT, f"{FOLDER}_start_rank{rank}_{attempt}"), "w").close()


pick = np.random.default_rng(7)
VICTIMS = [int(pick.integers(0, 2)), int(pick.integers(0, 2))]
MOMENTS = [int(pick.integers(1, 3)), int(pick.integers(7, 9))]  # before the checkpoint at 3; between 6 and 9


class Faults(Callback):
    def on_step_end(self, loop, metrics):
        if PART == "chaos":
            if attempt in (0, 2) and rank == VICTIMS[attempt // 2] and loop.done == MOMENTS[attempt // 2]:
                os.kill(os.getpid(), signal.SIGKILL)
            if attempt == 1 and rank == 1 and loop.done == 5:
                os.kill(os.getpid(), signal.SIGTERM)
        if PART == "half" and loop.done * world == 12:
            loop.request_stop("half")

    def on_end(self, loop, summary):
        with open(os.path.join(OUT, f"{FOLDER}_end_rank{rank}_{attempt}"), "w") as fh:
            fh.write(f"{loop.done} {summary['stopped']}")


if PART == "chaos" and attempt == 3 and rank == 0:  # rank 0 dies writing the checkpoint at 9
    from mindstep import checkpoint as _ckpt

    write = _ckpt._write_json_atomic

    def dying(path, value):
        if path.name.startswith("batch-0000009"):
            os.kill(os.getpid(), signal.SIGKILL)
        write(path, value)

    _ckpt._write_json_atomic = dying

mindstep.fit(step, BATCHES, epochs=1, out=run, save_every=3, log_every=2, progress=False, callbacks=[Faults()],
             resume="auto" if PART == "rest" else False, on_signal="exit")
state = {n: p.asnumpy() for n, p in mindstep.checkpoint.state(step).items()
         if not n.startswith("mindstep.acc") and n != "mindstep.micro"}
np.savez(os.path.join(OUT, f"{FOLDER}_{PART}_rank{rank}.npz"), **state)
print(f"rank {rank} of {world}: {PART} done", flush=True)
