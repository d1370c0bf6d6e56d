"""LR schedules: closed forms, MindSpore's own scheduler, in-graph evaluation, skip, no recompile."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import sgd_mlp
from mindstep import TrainStep, param_groups
from mindstep import schedules as S
from mindstep.models import MLP, seeded

MODES = [pytest.param(False, id="pynative"), pytest.param(True, id="jit")]


def closed_sgdr(step, lr, t0, tmult, eta_min):
    t, period = step, t0
    while t >= period:
        t -= period
        period *= tmult
    return eta_min + 0.5 * (lr - eta_min) * (1 + math.cos(math.pi * t / period))


SCHEDULES = {
    "constant": (S.constant(0.1), lambda s: 0.1),
    "cosine": (S.cosine_decay(0.1, 10, 0.01), lambda s: 0.01 + 0.045 * (1 + math.cos(math.pi * min(s, 10) / 10))),
    "step": (S.step_decay(0.1, 3, 0.5), lambda s: 0.1 * 0.5 ** (s // 3)),
    "sgdr-1": (S.sgdr(0.1, 4, 1, 0.001), lambda s: closed_sgdr(s, 0.1, 4, 1, 0.001)),
    "sgdr-2": (S.sgdr(0.1, 3, 2, 0.0), lambda s: closed_sgdr(s, 0.1, 3, 2, 0.0)),
    "sgdr-3": (S.sgdr(0.05, 2, 3, 0.01), lambda s: closed_sgdr(s, 0.05, 2, 3, 0.01)),
    "warmup-cosine": (S.warmup(5, S.cosine_decay(0.1, 10)),
                      lambda s: 0.1 * s / 5 if s < 5 else 0.05 * (1 + math.cos(math.pi * min(s - 5, 10) / 10))),
    "linear-warmup": (S.linear_warmup(0.2, 4, 0.25), lambda s: 0.2 * (0.25 + 0.75 * s / 4) if s < 4 else 0.2),
}
STEPS = 60  # several restart cycles for every SGDR variant


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_host_and_graph_values_equal_the_closed_form(name):
    sched, closed = SCHEDULES[name]
    host = [sched.value(s) for s in range(STEPS)]
    graph = [float(sched(ms.Tensor(s, ms.int32)).asnumpy()) for s in range(STEPS)]
    expected = [closed(s) for s in range(STEPS)]
    np.testing.assert_allclose(host, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(graph, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("t0, tmult, eta_min", [(3, 1, 0.0), (2, 2, 0.001), (3, 3, 0.01)])
def test_sgdr_matches_mindspore_cosine_annealing_warm_restarts(t0, tmult, eta_min):
    from mindspore.experimental.optim import SGD
    from mindspore.experimental.optim.lr_scheduler import CosineAnnealingWarmRestarts

    p = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="w")
    opt = SGD([p], lr=0.1)
    sched = CosineAnnealingWarmRestarts(opt, T_0=t0, T_mult=tmult, eta_min=eta_min)
    theirs = []
    for _ in range(40):
        theirs.append(float(sched.get_last_lr()[0].asnumpy()))
        sched.step()
    ours = [S.sgdr(0.1, t0, tmult, eta_min).value(s) for s in range(40)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("jit", MODES)
def test_step_sets_lr_every_update_in_graph_without_recompiling(jit):
    sched = S.warmup(2, S.sgdr(0.1, 3, 2, 0.0))
    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), 0.1)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, lr_schedule=sched, jit=jit)
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    y = np.arange(8, dtype=np.int32)
    lrs = [float(step(x, y)["lr"]) for _ in range(16)]  # warmup, then cycles of 3, 6 (two restarts)
    np.testing.assert_allclose(lrs, [sched.value(s) for s in range(16)], rtol=1e-5, atol=1e-7)
    assert float(opt.learning_rate.asnumpy()) == pytest.approx(sched.value(15), rel=1e-5)
    assert step.compile_count == (1 if jit else 0)


@pytest.mark.parametrize("jit", MODES)
def test_sgd_update_uses_the_scheduled_lr(jit):
    """With SGD the update is lr * grad, so the LR in effect is observable from the weights."""
    net, opt, forward = sgd_mlp()
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    y = np.arange(8, dtype=np.int32)
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    step = TrainStep(forward, opt, lr_schedule=S.step_decay(0.5, 1, 0.1), jit=jit)
    for s in range(3):
        _, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        before = net.fc2.bias.asnumpy().copy()
        step(x, y)
        delta = before - net.fc2.bias.asnumpy()
        np.testing.assert_allclose(delta, 0.5 * 0.1 ** s * grads[-1].asnumpy(), rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("jit", MODES)
def test_skipped_update_does_not_advance_the_schedule(jit):
    net = seeded(MLP)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, s):
        return loss_fn(net(x), y) * s

    sched = S.step_decay(0.1, 1, 0.5)
    step = TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), lr_schedule=sched, loss_scale=1024.0, jit=jit)
    x = np.ones((4, 32), np.float32)
    y = np.arange(4, dtype=np.int32)
    lrs = [float(step(x, y, np.float32(s))["lr"]) for s in (1, np.inf, np.inf, 1, 1)]
    assert lrs == pytest.approx([0.1, 0.05, 0.05, 0.05, 0.025])


@pytest.mark.parametrize("jit", MODES)
def test_groups_keep_their_lr_ratio_through_the_schedule(jit):
    net = seeded(MLP)
    groups = param_groups(net, lr=0.1, lr_scale={"fc2.*": 10.0})
    opt = nn.Momentum(groups, 0.1, 0.9)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, lr_schedule=S.cosine_decay(0.1, 4), jit=jit)
    x = np.ones((4, 32), np.float32)
    y = np.arange(4, dtype=np.int32)
    for s in range(4):
        m = step(x, y)
        base = S.cosine_decay(0.1, 4).value(s)
        assert float(m["lr"]) == pytest.approx(base, rel=1e-5)
        group_lrs = sorted(float(m[k]) for k in m if k.startswith("lr/group"))
        assert group_lrs[0] == pytest.approx(base, rel=1e-5) and group_lrs[-1] == pytest.approx(10 * base, rel=1e-5)


def test_experimental_optimizer_lr_is_scheduled_too():
    from mindspore.experimental.optim import AdamW

    net = seeded(MLP)
    opt = AdamW(param_groups(net, weight_decay=0.01, order_params=False), lr=1e-3)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, lr_schedule=S.step_decay(1e-3, 1, 0.5))
    x = np.ones((4, 32), np.float32)
    y = np.arange(4, dtype=np.int32)
    for _ in range(3):
        step(x, y)
    assert [float(p.asnumpy()) for p in opt.lrs] == pytest.approx([2.5e-4] * len(opt.lrs))


@pytest.mark.parametrize("make, words", [
    (lambda: S.cosine_decay(0.1, 0), ["`total_steps`", ">= 1"]),
    (lambda: S.sgdr(0.1, 3, 0), ["`T_mult`"]),
    (lambda: S.sgdr(0.1, 3, 1, eta_min=0.5), ["`eta_min`", "<= 0.1"]),
    (lambda: S.step_decay(0.1, 2, 1.5), ["`gamma`"]),
    (lambda: S.warmup(3, 0.1), ["`then`", "schedule"]),
    (lambda: S.constant(-1.0), ["`lr`", ">= 0.0"]),
])
def test_bad_schedule_arguments(make, words):
    with pytest.raises((TypeError, ValueError)) as info:
        make()
    for word in words:
        assert word in str(info.value)


def test_dynamic_lr_optimizer_with_schedule_is_refused():
    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), nn.CosineDecayLR(0.0, 0.1, 10))
    with pytest.raises(ValueError, match="float"):
        TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, lr_schedule=S.constant(0.1))
