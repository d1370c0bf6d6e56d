"""TrainStep core: equals a hand-written reference step, in PyNative and compiled, and compiles once."""
import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import assert_params_close, batches, params_np
from mindstep import TrainStep
from mindstep.models import MLP, ConvNet, seeded

MODELS = {
    "mlp": (MLP, (8, 32)),
    "convnet": (ConvNet, (4, 3, 8, 8)),
}
OPTIMIZERS = {
    "momentum": lambda params: nn.Momentum(params, 0.05, 0.9),
    "adam": lambda params: nn.Adam(params, 1e-2),
}
STEPS = 4


def reference_run(model, optimizer, data):
    """The plain MindSpore step a user would write by hand, run eagerly."""
    factory, _ = MODELS[model]
    net = seeded(factory)
    net.set_train(True)
    opt = OPTIMIZERS[optimizer](net.trainable_params())
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    losses = []
    for x, y in data:
        loss, grads = grad_fn(x, y)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses, params_np(net.get_parameters())


def mindstep_run(model, optimizer, data, **kwargs):
    factory, _ = MODELS[model]
    net = seeded(factory)
    opt = OPTIMIZERS[optimizer](net.trainable_params())
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, **kwargs)
    losses = [float(step(x, y)["loss"]) for x, y in data]
    return losses, params_np(net.get_parameters()), step


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("mode", [
    pytest.param({"jit": False}, id="pynative"),
    pytest.param({"jit": True}, id="jit-cell"),
    pytest.param({"jit": True, "compiler": "function"}, id="jit-function"),
])
def test_step_matches_hand_written_reference(model, optimizer, mode):
    data = batches(STEPS, MODELS[model][1])
    ref_losses, ref_params = reference_run(model, optimizer, data)
    losses, params, step = mindstep_run(model, optimizer, data, **mode)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    assert_params_close(params, ref_params)
    init = params_np(seeded(MODELS[model][0]).get_parameters())
    moved = max(np.abs(params[k] - init[k]).max() for k in init)
    assert moved > 1e-3, "the weights must move for this comparison to mean anything"
    assert step.compile_count == (1 if mode["jit"] else 0)


def test_metrics_dict_has_loss_and_step_and_aux():
    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), 0.1)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        logits = net(x)
        loss = loss_fn(logits, y)
        acc = (logits.argmax(1) == y).astype(ms.float32).mean()
        return loss, {"acc": acc, "double_loss": loss * 2}

    step = TrainStep(forward, opt)
    for i, (x, y) in enumerate(batches(3, (8, 32)), start=1):
        m = step(x, y)
        assert set(m) == {"loss", "step", "applied", "skipped", "skipped_in_row", "acc", "double_loss"}
        assert int(m["step"]) == i
        assert float(m["double_loss"]) == pytest.approx(2 * float(m["loss"]), rel=1e-6)
        assert 0.0 <= float(m["acc"]) <= 1.0


def test_compile_count_stays_one_over_ten_calls():
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Adam(net.trainable_params(), 1e-3))
    for x, y in batches(10, (8, 32)):
        step(x, y)
    assert step.compile_count == 1


def test_python_scalar_inputs_do_not_recompile():
    net = seeded(MLP)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y, weight):
        return loss_fn(net(x), y) * weight

    step = TrainStep(forward, nn.SGD(net.trainable_params(), 0.1))
    x, y = batches(1, (8, 32))[0]
    losses = [float(step(x, y, w)["loss"]) for w in (0.5, 1.0, 2.0, 3.0)]
    assert step.compile_count == 1
    assert losses[1] > losses[0], "the scalar must be a live input, not a constant frozen at compile time"


@pytest.mark.parametrize("compiler", ["cell", "function"])
def test_new_shape_recompiles_once_and_warns(compiler, caplog):
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1), compiler=compiler)
    (x8, y8), = batches(1, (8, 32))
    (x4, y4), = batches(1, (4, 32))
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        step(x8, y8)
        step(x8, y8)
        assert not caplog.records
        step(x4, y4)
        assert step.compile_count == 2
        assert len(caplog.records) == 1
        assert "batch[0] shape (4, 32) (was (8, 32))" in caplog.records[0].getMessage()
        assert "pad or bucket" in caplog.records[0].getMessage()
        for _ in range(3):  # both shapes are cached now: no more compiles, no more warnings
            step(x8, y8)
            step(x4, y4)
    assert step.compile_count == 2
    assert len(caplog.records) == 1


@pytest.mark.parametrize("change, said, advice, not_said", [
    pytest.param("dtype", "batch[0] dtype Float64 (was Float32)", "x.astype(np.float32)", "pad or bucket", id="dtype"),
    pytest.param("rank", "batch[0] rank 3 (was 2", "A dimension appeared or went away", "pad or bucket", id="rank"),
])
def test_a_recompile_says_what_changed_and_the_advice_for_that_kind(change, said, advice, not_said, caplog):
    net = seeded(MLP)

    def forward(x, y):
        return nn.CrossEntropyLoss()(net(x.astype(ms.float32).reshape(-1, 32)), y)

    step = TrainStep(forward, nn.SGD(net.trainable_params(), 0.1))
    (x, y), = batches(1, (8, 32))
    step(x, y)
    other = x.asnumpy().astype(np.float64) if change == "dtype" else x.asnumpy().reshape(2, 4, 32)
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        step(other, y)
    (record,) = caplog.records
    message = record.getMessage()
    assert said in message and advice in message and not_said not in message


def test_state_parameters_are_prefixed_and_net_names_unchanged():
    net = seeded(MLP)
    names_before = [p.name for p in net.get_parameters()]
    opt = nn.Adam(net.trainable_params(), 1e-3)
    opt_names = [p.name for p in opt.parameters] + [p.name for p in opt.moment1]
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, name="ms")
    step(*batches(1, (8, 32))[0])
    assert [p.name for p in net.get_parameters()] == names_before
    assert [p.name for p in opt.parameters] + [p.name for p in opt.moment1] == opt_names
    assert sorted(p.name for p in step.state_parameters()) == ["ms.skipped", "ms.skipped_in_row", "ms.step"]


def test_host_weight_write_is_seen_by_the_compiled_step():
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.0))
    x, y = batches(1, (8, 32))[0]
    before = float(step(x, y)["loss"])
    for p in net.trainable_params():
        p.set_data(ms.Tensor(np.zeros(p.shape, np.float32)))
    after = float(step(x, y)["loss"])
    assert after == pytest.approx(np.log(10.0), rel=1e-5), "zero weights give uniform logits"
    assert before != pytest.approx(after)


def test_calls_after_the_compile_skip_the_cell_lookup_and_match_it_bit_for_bit(monkeypatch):
    """After a signature's first call the runner runs MindSpore's compiled phase directly
    (`_compile._run_compiled`); the weights, losses and compile counts must be those of the
    `Cell.__call__` path, also across a second input shape and back."""
    from mindstep import _compile

    def train(fast: bool):
        net = seeded(MLP)
        step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
        direct = []
        if fast:
            run = _compile._run_compiled
            monkeypatch.setattr(_compile, "_run_compiled", lambda *a: direct.append(1) or run(*a))
        else:
            monkeypatch.setattr(_compile, "_compiled_phase", lambda cell: None)
        data = batches(3, (8, 32)) + batches(2, (4, 32), seed=1) + batches(2, (8, 32), seed=2)
        losses = [float(step(x, y)["loss"]) for x, y in data]
        monkeypatch.undo()
        return losses, params_np(net.trainable_params()), step.compile_count, len(direct)

    fast, slow = train(True), train(False)
    assert fast[0] == slow[0]
    for name, value in slow[1].items():
        np.testing.assert_array_equal(fast[1][name], value, err_msg=name)
    assert fast[2] == slow[2] == 2, "one compile per input shape"
    assert (fast[3], slow[3]) == (5, 0), "every call after a shape's first runs the compiled phase directly"
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_jit_false_never_compiles_and_leaves_context_in_pynative():
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1), jit=False)
    step(*batches(1, (8, 32))[0])
    assert step.compile_count == 0 and step.compiler == "eager"
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_cells_in_forward_closure_are_put_in_training_mode():
    net = seeded(ConvNet)
    assert not net.training
    TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
    assert net.training and all(c.training for _, c in net.cells_and_names())


@pytest.mark.parametrize("accumulate", [1, 2])
def test_compile_apart_trains_nothing_and_the_first_call_does_not_compile(accumulate, caplog):
    """`step.compile(*batch)` builds every graph (an accumulating step's update graph too) and changes no
    weight, counter or optimizer state; the calls after it compile nothing and train exactly as a step
    that compiled at its first call (BatchNorm in training mode, Adam's moments, the window)."""
    def make():
        net = seeded(ConvNet)
        opt = nn.Adam(net.trainable_params(), 1e-2)
        return net, TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, accumulate=accumulate)

    data = batches(4, MODELS["convnet"][1])
    net, step = make()
    ref_net, ref = make()
    before = params_np(net.get_parameters()) | params_np(step.state_parameters())
    assert step.compile(*data[0]) == (2 if accumulate > 1 else 1)
    assert step.compile_count == 1 and step.update_compile_count == (1 if accumulate > 1 else 0)
    after = params_np(net.get_parameters()) | params_np(step.state_parameters())
    assert all(np.array_equal(after[k], before[k]) for k in before), "compile() must not train"
    assert step.compile(*data[1]) == 0  # same signature: compiled already
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        losses = [float(step(x, y)["loss"]) for x, y in data]
    assert not caplog.records
    assert step.compile_count == 1 and step.update_compile_count == (1 if accumulate > 1 else 0)
    assert losses == [float(ref(x, y)["loss"]) for x, y in data]
    assert_params_close(params_np(net.get_parameters()), params_np(ref_net.get_parameters()), rtol=0, atol=0)
    assert int(step(*data[0])["step"]) == 5 // accumulate  # updates so far


def test_compile_apart_runs_the_pass_first_and_refuses_what_it_cannot_compile():
    net = seeded(ConvNet)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1),
                              optimize={"force": {"*": "one-gemm"}, "memory_budget_mb": None})
    x, y = batches(1, MODELS["convnet"][1])[0]
    step.compile(x, y)
    assert step.optimize_report and any(r["choice"] != "native" for r in step.optimize_report)
    step(x, y)
    assert step.compile_count == 1
    for kwargs in ({"jit": False}, {"compiler": "function"}):
        net2 = seeded(MLP)
        other = TrainStep.from_net(net2, nn.CrossEntropyLoss(), nn.SGD(net2.trainable_params(), 0.1), **kwargs)
        with pytest.raises(ValueError, match=r"compiler=.*valid: 'cell'.*compiler='cell'"):
            other.compile(*batches(1, (8, 32))[0])
    with pytest.raises(ValueError, match=r"step.compile\(\*batch\) needs at least one batch element"):
        step.compile()


def test_the_compile_number_in_a_recompile_warning_counts_every_graph_compiled(caplog):
    """A call that compiles two graphs (MindSpore's cache grows by 2) is compile #3 after one, not #2."""
    from mindstep import _compile

    net = seeded(MLP)
    runner = _compile.Runner(net, jit=True, compiler="cell", name="t")
    (x8, _), = batches(1, (8, 32))
    (x4, _), = batches(1, (4, 32))
    sizes = iter([0, 1, 1, 3])
    runner._cache_size = lambda: next(sizes)
    runner._counted((ms.Tensor(x8),), lambda tensors, sig: None)
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        runner._counted((ms.Tensor(x4),), lambda tensors, sig: None)
    assert runner.compile_count == 3
    assert "compile #3" in caplog.records[0].getMessage()
