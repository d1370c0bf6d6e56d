"""Data-parallel cases, run the way users run them: a module-level script under `mindstep launch`.

    mindstep launch --nproc 2 -- python tests/dp_cases.py OUT      # each rank: OUT/<case>_rank<r>.npz
    python tests/dp_cases.py OUT --reference                        # one process: OUT/<case>_ref.npz

Each case draws the same global batches everywhere; a rank trains on its interleaved half (rows
r, r + 2, ..., as `mindspore.dataset` sharding gives them), the reference on all of them.
Not collected by pytest (the name does not start with test_); tests/test_dist.py runs it.
"""
import os
import sys
import time

import numpy as np

import mindspore as ms
from mindspore import nn, ops
import mindspore.dataset as ds

import mindstep

OUT = sys.argv[1]
REFERENCE = "--reference" in sys.argv
rank, world = (0, 1) if REFERENCE else mindstep.init_distributed()
rng = np.random.default_rng(0)


def batches(n_steps, rows, feat=4):
    out = []
    for _ in range(n_steps):
        x = rng.standard_normal((rows, feat)).astype(np.float32)
        out.append((x, x.sum(1, keepdims=True).astype(np.float32)))
    return out


def mine(*arrays):
    """This rank's rows of a global batch (all of them for the reference)."""
    return tuple(a if REFERENCE else a[rank::world] for a in arrays)


def build(case):
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))
    return net, nn.Momentum(net.trainable_params(), 0.05, 0.9)


def save(case, net, metrics):
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    extra = {f"metric_{k}": np.asarray([float(m[k]) for m in metrics]) for k in metrics[0]} if metrics else {}
    who = "ref" if REFERENCE else f"rank{rank}"
    np.savez(os.path.join(OUT, f"{case}_{who}.npz"), **params, **extra)


# plain: k = 1, mean loss
net, opt = build("plain")
loss_fn = nn.MSELoss()


def forward(x, y):
    return loss_fn(net(x), y)


step = mindstep.TrainStep(forward, opt, name="plain")
save("plain", net, [step(*mine(x, y)) for x, y in batches(3, 8)])

# accum: accumulate=2. Rank 1 starts its first micro-step only once rank 0 has finished its own:
# a micro-step that communicated would wait for rank 1 forever (until the collective timeout).
net, opt = build("accum")
step = mindstep.TrainStep(forward, opt, name="accum", accumulate=1 if REFERENCE else 2)
flag = os.path.join(OUT, "accum_rank0_micro_done")
metrics = []
for i, (x, y) in enumerate(batches(4, 8)):
    if REFERENCE:  # the reference steps once per window, on the window's 16 rows
        if i % 2 == 0:
            first = (x, y)
            continue
        metrics.append(step(np.concatenate([first[0], x]), np.concatenate([first[1], y])))
        continue
    if i == 0 and rank != 0:
        deadline = time.time() + 60
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.05)
    m = step(*mine(x, y))
    float(m["loss"])  # wait for the micro-step to finish
    if i == 0 and rank == 0:
        open(flag, "w").close()
    metrics.append(m)
save("accum", net, metrics)

# overflow: dynamic loss scale; at step 1 rank 1's loss is inf: both ranks skip, both scales halve
net, opt = build("overflow")


def forward_scaled(x, y, factor):
    return loss_fn(net(x), y) * factor


step = mindstep.TrainStep(forward_scaled, opt, name="overflow", loss_scale="dynamic")
metrics = []
for i, (x, y) in enumerate(batches(3, 8)):
    if REFERENCE and i == 1:
        continue  # the skipped update
    factor = np.float32(np.inf if (i == 1 and rank == 1) else 1.0)
    metrics.append(step(*mine(x, y), ms.Tensor(factor)))
save("overflow", net, metrics)

# count: token-normalised loss with unequal token counts per rank (rank 0: 3 per row, rank 1: 5)
net, opt = build("count")


def forward_count(x, y, mask):
    err = ((net(x) - y) ** 2).sum(axis=1)
    return (err * mask).sum(), mask.sum()


step = mindstep.TrainStep(forward_count, opt, name="count", normalize="count")
masks = np.array([[1] * 3 + [0] * 7, [1] * 5 + [0] * 5] * 5, np.float32)  # rows 0, 2, ..: 3 tokens
metrics = []
for x, y in batches(3, 10, feat=4):
    x3 = np.repeat(x[:, None, :], 10, axis=1)  # 10 "tokens" per row
    y3 = np.repeat(y, 10, axis=1)[..., None]
    metrics.append(step(*mine(x3, y3, masks)))
save("count", net, metrics)

# fit: a list of batches, each rank taking every other one (the reference: the pairs joined), and
# an evaluation whose Mean is merged over both ranks' batches (3 of them: rank 0 evaluates two)
net, opt = build("fit")
step = mindstep.TrainStep(forward, opt, name="fit")
train = batches(4, 8)
if REFERENCE:
    train = [(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])) for a, b in zip(train[::2], train[1::2])]
held_out = batches(3, 5)
summary = mindstep.fit(step, train, epochs=1, eval_data=held_out, eval_fn=mindstep.loop.loss(), progress=False)
params = {p.name: p.asnumpy() for p in net.trainable_params()}
np.savez(os.path.join(OUT, f"fit_{'ref' if REFERENCE else f'rank{rank}'}.npz"), **params,
         eval_loss=summary["eval"]["loss"], eval_loss_initial=summary["eval"]["loss_initial"], steps=summary["steps"])

# shards: what mindstep.shard_args() gives a mindspore.dataset pipeline on this rank
ids = ds.NumpySlicesDataset({"id": np.arange(10, dtype=np.int32)}, shuffle=False, **mindstep.shard_args())
np.save(os.path.join(OUT, f"shards_{'ref' if REFERENCE else f'rank{rank}'}.npy"),
        np.array([int(row["id"]) for row in ids.create_dict_iterator(output_numpy=True)]))
print(f"rank {rank} of {world}: done", flush=True)
