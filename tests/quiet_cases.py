"""Every pipeline configuration the tests build, compiled in one module-level script with MindSpore's
warnings on (`GLOG_v=2`); `test_quiet_compile.py` reads its stderr. Between the `=== <case>` and
`=== end` markers only the step is built, compiled and called: networks and optimizers (whose
constructors log MindSpore's own deprecation notes) are made before a case's marker."""
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

import mindstep
from mindstep import losses, schedules
from mindstep.models import ConvNet, MLP, seeded

X = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
Y = np.arange(4, dtype=np.int32)
W = np.ones(4, np.float32)
IMAGES = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
CE = nn.CrossEntropyLoss()
CE_SUM = nn.CrossEntropyLoss(reduction="none")


def mark(text):
    sys.stderr.write(f"=== {text}\n")
    sys.stderr.flush()


def case(name, build, batch, calls=2):
    step = None
    mark(name)
    step = build()
    for _ in range(calls):
        step(*batch)
    mark("end")
    return step


def mean_step(**kwargs):
    net = seeded(MLP)
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)

    def forward(x, y, w):
        logits = net(x)
        return CE(logits, y), logits

    return lambda: mindstep.TrainStep(forward, opt, **kwargs)


def count_step(**kwargs):
    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), 0.01)

    def forward(x, y, w):
        return (CE_SUM(net(x), y) * w).sum(), w.sum()

    return lambda: mindstep.TrainStep(forward, opt, normalize="count", **kwargs)


def parts_step(weighting):
    net = seeded(MLP)
    params = net.trainable_params() + (weighting.trainable_params() if isinstance(weighting, nn.Cell) else [])
    opt = nn.Adam(params, 1e-3)

    def forward(x, y, w):
        logits = net(x)
        return {"ce": CE(logits, y), "l2": (logits * logits).mean()}, {"acc": (logits.argmax(1) == y).astype(ms.float32).mean()}

    return lambda: mindstep.TrainStep(forward, opt, losses=weighting)


def gan():
    g = nn.SequentialCell(nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 4))
    d = nn.SequentialCell(nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 1))
    g.update_parameters_name("g.")
    d.update_parameters_name("d.")
    d_opt, g_opt = nn.Adam(d.trainable_params(), 1e-3), nn.Adam(g.trainable_params(), 1e-3)

    def d_loss(fake, x, real):
        return ops.softplus(-d(real)).mean() + ops.softplus(d(fake)).mean()

    def g_loss(fake, x, real):
        return ops.softplus(-d(fake)).mean()

    return lambda: mindstep.GANStep(g, d, d_loss, g_loss, d_opt, g_opt, d_steps_per_g=2,
                                    d_options={"loss_scale": "dynamic", "ema": 0.9},
                                    g_options={"clip_grad_norm": 1.0})


def conv_step():
    net = seeded(ConvNet)
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)

    def forward(x, y):
        return CE(net(x), y)

    return lambda: mindstep.TrainStep(forward, opt, optimize={"force": {"*": "one-gemm"}})


CASES = [
    ("default", mean_step(), (X, Y, W), 2),
    ("dynamic scale", mean_step(loss_scale="dynamic"), (X, Y, W), 2),
    ("static scale", mean_step(loss_scale=128.0), (X, Y, W), 2),
    ("every feature, k=3", mean_step(accumulate=3, loss_scale="dynamic", clip_grad_norm=1.0, clip_grad_value=0.5,
                                     ema=0.9, on_nonfinite="raise",
                                     lr_schedule=schedules.cosine_decay(0.01, 10)), (X, Y, W), 6),
    ("no check", mean_step(on_nonfinite="apply"), (X, Y, W), 2),
    ("no check, k=2", mean_step(on_nonfinite="apply", accumulate=2), (X, Y, W), 4),
    ("O2 keep_fp32", mean_step(precision="O2", keep_fp32=["fc2"]), (X, Y, W), 2),
    ("function compiler", mean_step(compiler="function"), (X, Y, W), 2),
    ("function compiler, k=2", mean_step(compiler="function", accumulate=2, loss_scale="dynamic"), (X, Y, W), 4),
    ("token count, k=2", count_step(accumulate=2, clip_grad_value=0.5), (X, Y, W), 4),
    ("weighted losses", parts_step(losses.weighted({"ce": 1.0, "l2": 0.1})), (X, Y, W), 2),
    ("uncertainty losses", parts_step(losses.uncertainty(["ce", "l2"])), (X, Y, W), 2),
    ("gan", gan(), (X[:, :4], X[:, :4]), 3),
    ("composed operators", conv_step(), (IMAGES, Y), 2),
]

if __name__ == "__main__":
    for name, build, batch, calls in CASES:
        case(name, build, batch, calls)
    print("cases", len(CASES))
