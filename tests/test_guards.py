"""Runtime guards (real recompiles, real host writes) and TrainStep(debug=True)."""
import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from conftest import batches, params_np
from mindstep import TrainStep
from mindstep.models import MLP, ConvNet, seeded


def test_host_write_into_a_jit_function_step_is_detected_and_resynced(caplog):
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.0), compiler="function")
    x, y = batches(1, (8, 32))[0]
    step(x, y)
    for p in net.trainable_params():
        p.set_data(ms.Tensor(np.zeros(p.shape, np.float32)))
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        loss = float(step(x, y)["loss"])
    assert loss == pytest.approx(np.log(10.0), rel=1e-5), "the compiled step must use the written weights"
    assert any("written from the host" in r.getMessage() and "fc1.weight" in r.getMessage() for r in caplog.records)
    assert step._runner.resyncs == 1


def test_without_guards_the_function_compiler_keeps_stale_weights():
    """The negative control: this is the MindSpore behaviour the guard exists for."""
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.0), compiler="function",
                              guards=False)
    x, y = batches(1, (8, 32))[0]
    before = float(step(x, y)["loss"])
    for p in net.trainable_params():
        p.set_data(ms.Tensor(np.zeros(p.shape, np.float32)))
    assert float(step(x, y)["loss"]) == pytest.approx(before)


def test_no_false_alarm_when_only_the_step_updates_weights(caplog):
    net = seeded(MLP)
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Adam(net.trainable_params(), 1e-2), compiler="function")
    with caplog.at_level(logging.WARNING, logger="mindstep"):
        for x, y in batches(5, (8, 32)):
            step(x, y)
    assert not caplog.records and step._runner.resyncs == 0 and step.compile_count == 1


def test_debug_prints_stage_shapes_once_and_changes_nothing(capsys):
    data = batches(3, (4, 3, 8, 8))
    results = {}
    for debug in (False, True):
        net = seeded(ConvNet)
        step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                  loss_scale=128.0, debug=debug)
        losses = [float(step(x, y)["loss"]) for x, y in data]
        results[debug] = (losses, params_np(net.get_parameters()))
    out = capsys.readouterr().out
    assert out.count("mindstep debug") == 1
    for word in ("input batch[0]: (4, 3, 8, 8) Float32", "input batch[1]: (4,) Int32", "forward: loss () Float32",
                 "loss scale: 128.0", "grads all:", "precision=O0"):
        assert word in out, word
    assert results[True][0] == results[False][0]
    for name, value in results[False][1].items():
        np.testing.assert_array_equal(results[True][1][name], value, err_msg=name)


def test_guards_and_debug_are_validated():
    net = seeded(MLP)
    with pytest.raises(TypeError, match="`guards`"):
        TrainStep.from_net(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), guards="yes")
    with pytest.raises(TypeError, match="`debug`"):
        TrainStep.from_net(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), debug=1)
