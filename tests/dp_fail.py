"""A data-parallel job in which rank 1 fails at step 3 (tests/test_dist.py runs it under launch).

    mindstep launch --nproc 2 -- python tests/dp_fail.py OUT raise|kill|sleep

raise: rank 1 raises; kill: rank 1 SIGKILLs itself; sleep: every rank waits (for Ctrl-C). Rank 1
writes OUT/failed_at (time.time()) just before failing; the other rank goes on training, so it
blocks in the step's all-reduce until the launcher stops it.
"""
import os
import signal
import sys
import time

import numpy as np

import mindstep
from mindspore import nn

out, how = sys.argv[1], sys.argv[2]
rank, world = mindstep.init_distributed()
net = nn.Dense(4, 1)
loss_fn = nn.MSELoss()


def forward(x, y):
    return loss_fn(net(x), y)


step = mindstep.TrainStep(forward, nn.SGD(net.trainable_params(), 0.01))
x, y = np.ones((4, 4), np.float32), np.zeros((4, 1), np.float32)
for i in range(10_000):
    if how == "sleep" and i == 1:
        open(os.path.join(out, f"sleeping_{rank}"), "w").close()
        time.sleep(600)
    if rank == 1 and i == 3 and how in ("raise", "kill"):
        with open(os.path.join(out, "failed_at"), "w") as fh:
            fh.write(repr(time.time()))
        if how == "raise":
            raise RuntimeError("rank 1 failed on purpose at step 3")
        os.kill(os.getpid(), signal.SIGKILL)
    float(step(x, y)["loss"])
