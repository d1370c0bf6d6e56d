"""GANStep: two objectives in one compiled pipeline, against a hand-written two-step loop."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from mindstep import GANStep, losses, schedules
from mindstep.checkpoint import read_manifest

pytestmark = pytest.mark.xdist_group("gan")


class Generator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 4))

    def construct(self, x):
        return self.body(x)


class Counted(Generator):
    """The generator, counting its forward calls (PyNative only: Python runs at every call)."""

    calls = 0

    def construct(self, x):
        self.calls += 1
        return self.body(x)


def make(seed=0, generator=Generator):
    ms.set_seed(seed)
    g = generator()
    d = nn.SequentialCell(nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 1))
    g.update_parameters_name("g.")
    d.update_parameters_name("d.")

    def d_loss(fake, x, real, bad):
        return (ops.softplus(-d(real)).mean() + ops.softplus(d(fake)).mean()) * bad

    def g_loss(fake, x, real, bad):
        return {"adv": ops.softplus(-d(fake)).mean(), "l1": (fake - real).abs().mean()}

    return g, d, d_loss, g_loss


def data(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32),
             np.float32(1.0)) for _ in range(n)]


WEIGHTS = {"adv": 0.5, "l1": 1.0}


def weights(*nets):
    return {p.name: p.asnumpy().copy() for net in nets for p in net.get_parameters()}


def reference(batches, order="d_first"):
    """The loop users write by hand: D on the detached output, G through a second forward."""
    g, d, d_loss, g_loss = make()
    d_opt, g_opt = nn.Adam(d.trainable_params(), 1e-2), nn.Adam(g.trainable_params(), 1e-2)
    d_grad = ms.value_and_grad(d_loss, None, d_opt.parameters)

    def g_total(x, r, b):
        parts = g_loss(g(x), x, r, b)
        return parts["adv"] * WEIGHTS["adv"] + parts["l1"] * WEIGHTS["l1"]

    g_grad = ms.value_and_grad(g_total, None, g_opt.parameters)
    for x, r, b in batches:
        x, r, b = ms.Tensor(x), ms.Tensor(r), ms.Tensor(b)
        if order == "d_first":
            fake = g(x)
            d_opt(d_grad(ops.stop_gradient(fake), x, r, b)[1])
            g_opt(g_grad(x, r, b)[1])
        else:
            fake = g(x)
            g_opt(g_grad(x, r, b)[1])
            d_opt(d_grad(ops.stop_gradient(fake), x, r, b)[1])
    return weights(g, d)


def gan(jit=True, order="d_first", generator=Generator, **kwargs):
    g, d, d_loss, g_loss = make(generator=generator)
    step = GANStep(g, d, d_loss, g_loss, nn.Adam(d.trainable_params(), 1e-2), nn.Adam(g.trainable_params(), 1e-2),
                   jit=jit, order=order, g_options={"losses": losses.weighted(WEIGHTS), **kwargs.pop("g_options", {})},
                   **kwargs)
    return step, g, d


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("order", ["d_first", "g_first"])
def test_equals_the_hand_written_two_step_loop(jit, order):
    batches = data()
    ref = reference(batches, order)
    step, g, d = gan(jit=jit, order=order)
    for batch in batches:
        m = step(*batch)
    got = weights(g, d)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert bool(m["applied/d"]) and bool(m["applied/g"])
    assert {"loss/d", "loss/g", "loss/g/adv", "loss/g/l1", "step/d", "step/g", "iteration"} <= set(m)
    assert int(m["step/d"]) == int(m["step/g"]) == len(batches)
    if jit:
        assert step.compile_count == 1


def test_the_generator_runs_forward_once_per_iteration():
    step, g, _ = gan(jit=False, generator=Counted)
    for i, batch in enumerate(data(3)):
        step(*batch)
        assert g.calls == i + 1


def test_each_update_moves_only_its_own_network():
    """D-only iterations (n-critic) leave the generator bit-identical; G-only (warm-up) the discriminator."""
    step, g, d = gan(d_steps_per_g=2, g_warmup=1)
    assert [step.phase(i) for i in range(5)] == ["g", "d", "dg", "d", "dg"]
    batches = data(3)
    before = weights(g, d)
    m = step(*batches[0])  # warm-up: G only
    after = weights(g, d)
    assert bool(m["applied/g"]) and not m["applied/d"]
    assert all(np.array_equal(before[n], after[n]) for n in before if n.startswith("d."))
    assert any(not np.array_equal(before[n], after[n]) for n in before if n.startswith("g."))
    m = step(*batches[1])  # D only
    again = weights(g, d)
    assert bool(m["applied/d"]) and not m["applied/g"]
    assert all(np.array_equal(after[n], again[n]) for n in after if n.startswith("g."))
    assert any(not np.array_equal(after[n], again[n]) for n in after if n.startswith("d."))
    step(*batches[2])
    assert step.compile_count == 3  # one graph per phase, each compiled once
    for batch in data(4, seed=1):
        step(*batch)
    assert step.compile_count == 3


def test_an_overflow_in_one_objective_skips_that_objective_only():
    step, g, d = gan(d_options={"loss_scale": "dynamic"}, g_options={"loss_scale": "dynamic"})
    batches = data(2)
    m = step(*batches[0])
    scale_d, scale_g = float(m["loss_scale/d"]), float(m["loss_scale/g"])
    before = weights(g, d)
    d_state = {p.name: p.asnumpy().copy() for p in step.optimizers["d"].get_parameters()}
    d_state.update((p.name, p.asnumpy().copy()) for p in step.state_parameters() if p.name.startswith("gan.d.")
                   and "loss_scale" not in p.name and "skipped" not in p.name)
    x, r, _ = batches[1]
    m = step(x, r, np.float32(np.inf))  # D's loss (only) is infinite
    after = weights(g, d)
    assert not bool(m["applied/d"]) and bool(m["applied/g"])
    assert bool(m["overflow/d"]) and not bool(m["overflow/g"])
    assert float(m["loss_scale/d"]) == scale_d / 2 and float(m["loss_scale/g"]) == scale_g
    assert all(np.array_equal(before[n], after[n]) for n in before if n.startswith("d."))
    assert any(not np.array_equal(before[n], after[n]) for n in before if n.startswith("g."))
    now = {p.name: p.asnumpy() for p in list(step.optimizers["d"].get_parameters()) + step.state_parameters()}
    for name, value in d_state.items():  # moments, beta powers, global_step, D's update counter
        assert np.array_equal(value, now[name]), name
    assert int(m["step/d"]) == 1 and int(m["step/g"]) == 2


def test_per_objective_stages_and_metrics():
    step, g, d = gan(d_options={"clip_grad_norm": 1e-3, "lr_schedule": schedules.constant(1e-2)},
                     g_options={"ema": 0.9})
    before = weights(g)
    m = step(*data(1)[0])
    assert {"grad_norm/d", "lr/d"} <= set(m) and "grad_norm/g" not in m
    with step.ema_weights("g"):
        shadow = weights(g)
    live = weights(g)
    for n in before:  # shadow = 0.9 * start + 0.1 * live after one update
        np.testing.assert_allclose(shadow[n], 0.9 * before[n] + 0.1 * live[n], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="d_options"):
        with step.ema_weights("d"):
            pass


def test_checkpoint_resume_continues_bit_identically(tmp_path):
    batches = data(4)
    step, g, d = gan(d_steps_per_g=2, d_options={"loss_scale": "dynamic"})
    for batch in batches:
        step(*batch)
    want = weights(g, d)
    step2, g2, d2 = gan(d_steps_per_g=2, d_options={"loss_scale": "dynamic"})
    for batch in batches[:3]:
        step2(*batch)
    path = step2.save(tmp_path / "gan.ckpt")
    step3, g3, d3 = gan(d_steps_per_g=2, d_options={"loss_scale": "dynamic"})
    step3.load(path)
    assert step3.iteration == 3 and step3.phase(step3.iteration) == "dg"
    step3(*batches[3])
    got = weights(g3, d3)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_bad_settings_are_named():
    g, d, d_loss, g_loss = make()
    d_opt, g_opt = nn.Adam(d.trainable_params(), 1e-2), nn.Adam(g.trainable_params(), 1e-2)
    with pytest.raises(ValueError, match="g_optimizer"):
        GANStep(g, d, d_loss, g_loss, d_opt, nn.Adam(d.trainable_params(), 1e-2))
    with pytest.raises(ValueError, match="order"):
        GANStep(g, d, d_loss, g_loss, d_opt, g_opt, order="g_then_d")
    with pytest.raises(ValueError, match="d_options.*clip"):
        GANStep(g, d, d_loss, g_loss, d_opt, g_opt, d_options={"clip": 1.0})
    with pytest.raises(ValueError, match="d_steps_per_g"):
        GANStep(g, d, d_loss, g_loss, d_opt, g_opt, d_steps_per_g=0)
    with pytest.raises(ValueError, match="lambda"):
        GANStep(g, d, lambda f, x, r, b: f.sum(), g_loss, d_opt, g_opt)


def test_a_name_that_clashes_with_a_parameter_prefix_is_refused_when_built():
    """As TrainStep does: a step prefix equal to a network's parameter prefix ("d.", "g.") would make
    the step's Parameters and the network's share names, found only when a checkpoint is saved."""
    g, d, d_loss, g_loss = make()
    d_opt, g_opt = nn.Adam(d.trainable_params(), 1e-2), nn.Adam(g.trainable_params(), 1e-2)
    with pytest.raises(ValueError, match=r"`name` must be a prefix that none.*but got 'd'"):
        GANStep(g, d, d_loss, g_loss, d_opt, g_opt, name="d")


def test_a_custom_precision_policy_is_saved_as_the_policy(tmp_path):
    step, _, _ = gan(jit=False, precision="p=f32,c=f16,o=f32", d_options={"loss_scale": None},
                     g_options={"loss_scale": None})
    step(*data(1)[0])
    path = step.save(tmp_path / "gan")
    assert read_manifest(path)["settings"]["precision"] == "p=f32,c=f16,o=f32"
