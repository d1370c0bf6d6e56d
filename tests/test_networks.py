"""How the step finds the networks `forward` trains (issue 13): by reading its code, never by
running it, wherever a user keeps the network; and what it says when it cannot find them."""
import functools
import json
import subprocess
import sys
import textwrap
import types
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

import mindstep
from mindstep._discover import find

NET = nn.Dense(4, 2)
OTHER = nn.Dense(4, 2)  # a global that no forward below uses
NETS = [nn.Dense(4, 2)]
MODULE = types.ModuleType("user_models")
MODULE.net = nn.Dense(4, 2)


def _global_forward(x):
    return ops.relu(NET(x)).sum()


def _default_forward(x, net=NET):
    return net(x).sum()


def _logits(x):
    return NET(x)


def _helper_forward(x):
    return _logits(x).sum()


def _module_forward(x):
    return MODULE.net(x).sum()


def _list_forward(x):
    return NETS[0](x).sum()


def _comprehension_forward(x):
    return sum(n(x).sum() for n in NETS)


def _partial_target(net, x):
    return net(x).sum()


class _Trainer:
    def __init__(self, net):
        self.net = net

    def forward(self, x):
        return self.net(x).sum()

    def __call__(self, x):
        return self.net(x).sum()


class _Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.Dense(4, 2)

    def construct(self, x):
        return self.body(x)

    def loss(self, x):
        return self(x).sum()


def _closure():
    net = nn.Dense(4, 2)

    def forward(x):
        return net(x).sum()

    return forward, net


def _cases():
    model = _Model()
    forward, closure_net = _closure()
    trainer = _Trainer(nn.Dense(4, 2))
    return {
        "closure": (forward, closure_net),
        "global": (_global_forward, NET),
        "default-argument": (_default_forward, NET),
        "helper-function": (_helper_forward, NET),
        "module-attribute": (_module_forward, MODULE.net),
        "global-list": (_list_forward, NETS[0]),
        "comprehension": (_comprehension_forward, NETS[0]),
        "partial": (functools.partial(_partial_target, NET), NET),
        "object-method": (trainer.forward, trainer.net),
        "callable-object": (trainer, trainer.net),
        "cell-method": (model.loss, model),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_find_reaches_the_network_wherever_forward_keeps_it(case):
    forward, net = _cases()[case]
    found = find(forward).cells
    assert net in found
    assert OTHER not in found, "a global the code never uses must not be picked up"


def test_find_keeps_the_outermost_cell_only():
    model = _Model()

    def forward(x):
        return model.body(x).sum() + model(x).sum()

    assert find(forward).cells == [model]


def test_find_does_not_run_properties_or_forward():
    calls = []

    class Holder:
        @property
        def net(self):
            calls.append("property")
            return NET

        def forward(self, x):
            calls.append("forward")
            return self.net(x).sum()

    find(Holder().forward)
    assert calls == []


def test_find_sees_parameters_used_directly():
    w = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")

    def forward(x):
        return (x * w).sum()

    assert find(forward).parameters == [w]


def test_nets_argument_is_validated():
    net = nn.Dense(4, 2)
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x):
        return net(x).sum()

    for bad in ([], [net, "net"], "net"):
        with pytest.raises(TypeError) as info:
            mindstep.TrainStep(forward, opt, nets=bad)
        assert "nets" in str(info.value) and "nets=[net]" in str(info.value)


def _orphan_setup():
    net = nn.Dense(4, 2)
    holder = types.SimpleNamespace(model=net)
    attr = "model"
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x):  # getattr with a variable name: reading the code cannot tell which attribute
        return getattr(holder, attr)(x).sum()

    return net, opt, forward


def test_orphan_parameters_are_named_in_a_warning():
    net, opt, forward = _orphan_setup()
    with pytest.warns(mindstep.NetworkWarning) as record:
        mindstep.TrainStep(forward, opt)
    text = str(record[0].message)
    assert "'weight'" in text and "'bias'" in text and "nets=[net]" in text and "2 of the optimizer's 2" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mindstep.TrainStep(forward, opt, nets=[net])  # given explicitly: no warning


@pytest.mark.parametrize("setting", [{"precision": "O2"}, {"keep_fp32": [nn.Dense]}, {"optimize": True}],
                         ids=["precision", "keep_fp32", "optimize"])
def test_orphan_parameters_are_an_error_when_a_setting_needs_the_network(setting):
    net, opt, forward = _orphan_setup()
    with pytest.raises(ValueError) as info:
        mindstep.TrainStep(forward, opt, **setting)
    text = str(info.value)
    assert list(setting)[0] in text and "'weight'" in text and "nets=[net]" in text
    mindstep.TrainStep(forward, opt, nets=[net], **setting)


def test_a_frozen_network_that_forward_uses_keeps_its_mode():
    teacher = nn.SequentialCell(nn.Dense(4, 4), nn.BatchNorm1d(4))
    teacher.set_train(False)
    student = nn.Dense(4, 4)
    opt = nn.SGD(student.trainable_params(), 0.1)

    def forward(x):
        return ((student(x) - teacher(x)) ** 2).mean()

    step = mindstep.TrainStep(forward, opt, jit=False)
    step(np.ones((2, 4), np.float32))
    assert step.nets == [student] and student.training and not teacher.training


# ---- module-level scripts in a fresh interpreter, the way users write them ------------------------
SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    import numpy as np, mindspore as ms
    from mindspore import nn
    import mindstep

    warnings.simplefilter("error", mindstep.NetworkWarning)


    def make():
        ms.set_seed(0)
        return nn.SequentialCell(nn.Conv2d(3, 8, 3, has_bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dense(8, 4))

    rng = np.random.default_rng(0)
    BATCHES = [(ms.Tensor(rng.standard_normal((8, 3, 8, 8)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 4, 8).astype(np.int32))) for _ in range(3)]
    loss_fn = nn.CrossEntropyLoss()

    def state(net):
        return {p.name: p.asnumpy().tolist() for p in net.get_parameters()}

    def run(step, net):
        return {"losses": [float(step(x, y)["loss"]) for x, y in BATCHES], "state": state(net),
                "training": net.training, "cells": [type(c).__name__ for c in step.nets]}

    # the reference: MindSpore's own TrainOneStepCell, in GRAPH_MODE, on the same weights and data
    ref_net = make()
    cell = nn.TrainOneStepCell(nn.WithLossCell(ref_net, loss_fn), nn.Momentum(ref_net.trainable_params(), 0.1, 0.9))
    cell.set_train()
    ms.set_context(mode=ms.GRAPH_MODE)
    results = {"reference": {"losses": [float(cell(x, y).asnumpy()) for x, y in BATCHES], "state": state(ref_net)}}
    ms.set_context(mode=ms.PYNATIVE_MODE)

    # 1. the network as a global, left in inference mode by an earlier evaluation
    net = make()
    net.set_train(False)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)

    def forward(x, y):
        return loss_fn(net(x), y)

    results["global"] = run(mindstep.TrainStep(forward, opt), net)

    net_e = make()
    net_e.set_train(False)

    def forward_e(x, y):
        return loss_fn(net_e(x), y)

    results["global-eager"] = run(mindstep.TrainStep(forward_e, nn.Momentum(net_e.trainable_params(), 0.1, 0.9),
                                                     jit=False), net_e)

    # 2. as a closure
    def build():
        net = make()
        net.set_train(False)

        def forward(x, y):
            return loss_fn(net(x), y)

        return mindstep.TrainStep(forward, nn.Momentum(net.trainable_params(), 0.1, 0.9)), net

    results["closure"] = run(*build())

    # 3. as an attribute of an object whose method is the forward
    class Trainer:
        def __init__(self):
            self.net = make()
            self.net.set_train(False)
            self.loss = nn.CrossEntropyLoss()

        def forward(self, x, y):
            return self.loss(self.net(x), y)

    trainer = Trainer()
    results["method"] = run(mindstep.TrainStep(trainer.forward, nn.Momentum(trainer.net.trainable_params(), 0.1,
                                                                                0.9)), trainer.net)

    # 4. through a helper function that the forward calls
    helper_net = make()
    helper_net.set_train(False)

    def logits(x):
        return helper_net(x)

    def forward_helper(x, y):
        return loss_fn(logits(x), y)

    results["helper"] = run(mindstep.TrainStep(forward_helper, nn.Momentum(helper_net.trainable_params(), 0.1, 0.9)),
                            helper_net)

    # precision and the composed-operator pass reach a global network
    o3_net = make()

    def forward_o3(x, y):
        return loss_fn(o3_net(x), y)

    o3 = mindstep.TrainStep(forward_o3, nn.Momentum(o3_net.trainable_params(), 0.1, 0.9), precision="O3")
    o3(*BATCHES[0])
    results["o3"] = {"cast": o3.cast_cells, "loss_cast": [type(c).__name__ for c in o3.cells if not c.trainable_params()]}

    opt_net = make()

    def forward_opt(x, y):
        return loss_fn(opt_net(x), y)

    opt_step = mindstep.TrainStep(forward_opt, nn.Momentum(opt_net.trainable_params(), 0.1, 0.9),
                                  optimize={"force": {"*": "one-gemm"}})
    opt_step(*BATCHES[0])
    results["optimize"] = {"layers": [type(c).__name__ for c in opt_net.cells()],
                           "choices": [r["choice"] for r in opt_step.optimize_report]}

    # a user who sets GRAPH_MODE for the whole script, as MindSpore's own tutorials do
    ms.set_context(mode=ms.GRAPH_MODE)
    g_net = make()

    def forward_g(x, y):
        return loss_fn(g_net(x), y)

    g_step = mindstep.TrainStep(forward_g, nn.Momentum(g_net.trainable_params(), 0.1, 0.9),
                                optimize={"force": {"*": "one-gemm"}})
    g_step(*BATCHES[0])
    g_table = mindstep.optimize(make(), (BATCHES[0][0],), force={"*": "batched"})
    results["graph-mode"] = {"step": [r["choice"] for r in g_step.optimize_report],
                             "optimize": [r["choice"] for r in g_table],
                             "still_graph": ms.get_context("mode") == ms.GRAPH_MODE}
    # every way of running the step, still under the global GRAPH_MODE, against the reference
    def closure_step(**kwargs):
        run_net = make()

        def forward_run(x, y):
            return loss_fn(run_net(x), y)

        return mindstep.TrainStep(forward_run, nn.Momentum(run_net.trainable_params(), 0.1, 0.9), **kwargs), run_net

    for label, kwargs in (("graph-eager", {"jit": False}), ("graph-function", {"compiler": "function"}),
                          ("graph-cell", {}), ("graph-debug", {"debug": True})):
        results[label] = run(*closure_step(**kwargs))
    gan_g, gan_d = nn.Dense(4, 4), nn.Dense(4, 1)

    def d_loss(fake, x):
        return (gan_d(fake) ** 2).mean()

    def g_loss(fake, x):
        return ((gan_d(fake) - 1) ** 2).mean()

    gan = mindstep.GANStep(gan_g, gan_d, d_loss, g_loss, nn.SGD(gan_d.trainable_params(), 0.1),
                           nn.SGD(gan_g.trainable_params(), 0.1), jit=False)
    results["graph-gan-eager"] = float(gan(ms.Tensor(np.ones((2, 4), np.float32)))["loss/d"])
    ms.set_context(mode=ms.PYNATIVE_MODE)
    print("RESULTS " + json.dumps(results))
''')


@pytest.fixture(scope="module")
def script_results(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "train.py"
    path.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=path.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


@pytest.mark.xdist_group("networks-script")  # shares the module fixture `script_results`
@pytest.mark.parametrize("where", ["global", "global-eager", "closure", "method", "helper"])
def test_a_module_level_batchnorm_net_trains_like_train_one_step_cell(script_results, where):
    ref, got = script_results["reference"], script_results[where]
    assert got["training"] and got["cells"] == ["SequentialCell"]
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5, atol=1e-6)
    assert got["state"].keys() == ref["state"].keys()
    for name, value in ref["state"].items():  # weights and the BatchNorm statistics, which must have moved
        np.testing.assert_allclose(got["state"][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert np.abs(np.array(ref["state"]["1.moving_mean"])).sum() > 0


@pytest.mark.xdist_group("networks-script")  # shares the module fixture `script_results`
def test_precision_and_optimize_reach_a_global_network(script_results):
    assert script_results["o3"]["cast"].get("SequentialCell") == "f16"
    assert script_results["o3"]["loss_cast"] == ["CrossEntropyLoss"]
    assert script_results["optimize"]["choices"] == ["one-gemm"]
    assert script_results["optimize"]["layers"][0] == "GemmConv2d"


@pytest.mark.xdist_group("networks-script")  # shares the module fixture `script_results`
def test_the_pass_sees_the_layers_when_the_script_runs_in_graph_mode(script_results):
    # the shape probe's forward hooks fire in PyNative only: under a global GRAPH_MODE the pass once saw
    # no layer and silently rewrote nothing
    got = script_results["graph-mode"]
    assert got == {"step": ["one-gemm"], "optimize": ["batched"], "still_graph": True}


@pytest.mark.xdist_group("networks-script")  # shares the module fixture `script_results`
@pytest.mark.parametrize("where", ["graph-eager", "graph-function", "graph-cell", "graph-debug"])
def test_every_compiler_trains_like_the_reference_when_the_script_runs_in_graph_mode(script_results, where):
    # an eager step (jit=False), and debug=True's eager pass, under a global GRAPH_MODE once failed inside
    # MindSpore ("The pointer[seq_abs] is null"): the grad function was built, or called, in GRAPH_MODE
    ref, got = script_results["reference"], script_results[where]
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5, atol=1e-6)
    for name, value in ref["state"].items():
        np.testing.assert_allclose(got["state"][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert np.isfinite(script_results["graph-gan-eager"])
