"""Bad arguments fail on the host, before compiling, naming the argument, the value and the fix."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep
from mindstep.models import MLP, seeded


@pytest.fixture
def net():
    return seeded(MLP)


@pytest.fixture
def opt(net):
    return nn.SGD(net.trainable_params(), 0.1)


def good_forward(x, y):
    return x.sum()


@pytest.mark.parametrize("kwargs, exc, words", [
    pytest.param({"forward": 3}, TypeError, ["`forward`", "3 (type int)", "Pass the function itself"], id="forward-int"),
    pytest.param({"forward": lambda x: x}, ValueError, ["`forward`", "def"], id="forward-lambda"),
    pytest.param({"optimizer": "adam"}, TypeError, ["`optimizer`", "'adam'", "nn.Adam"], id="optimizer-str"),
    pytest.param({"optimizer": None}, TypeError, ["`optimizer`", "None"], id="optimizer-none"),
    pytest.param({"jit": 1}, TypeError, ["`jit`", "1 (type int)", "True or False"], id="jit-int"),
    pytest.param({"jit": "yes"}, TypeError, ["`jit`", "'yes'"], id="jit-str"),
    pytest.param({"compiler": "graph"}, ValueError, ["`compiler`", "'graph'", "'cell'", "'function'"], id="compiler-bad"),
    pytest.param({"compiler": None}, TypeError, ["`compiler`", "None"], id="compiler-none"),
    pytest.param({"name": "my.step"}, ValueError, ["`name`", "'my.step'", "identifier"], id="name-dot"),
    pytest.param({"name": ""}, ValueError, ["`name`"], id="name-empty"),
    pytest.param({"name": "fc1"}, ValueError, ["`name`", "'fc1'", "none of the optimizer"], id="name-clash"),
])
def test_bad_constructor_arguments(net, opt, kwargs, exc, words):
    args = {"forward": good_forward, "optimizer": opt}
    args.update(kwargs)
    forward, optimizer = args.pop("forward"), args.pop("optimizer")
    with pytest.raises(exc) as info:
        TrainStep(forward, optimizer, **args)
    for word in words:
        assert word in str(info.value)


def test_from_net_rejects_non_cell_and_non_callable_loss(net, opt):
    with pytest.raises(TypeError, match="`net` must be a mindspore.nn.Cell"):
        TrainStep.from_net(lambda x: x, nn.MSELoss(), opt)
    with pytest.raises(TypeError, match="`loss_fn` must be"):
        TrainStep.from_net(net, "mse", opt)


@pytest.mark.parametrize("bad, words", [
    pytest.param("text", ["`batch[1]`", "'text'"], id="str"),
    pytest.param([1, 2], ["`batch[1]`", "[1, 2]"], id="list"),
    pytest.param(None, ["`batch[1]`", "None"], id="none"),
])
def test_bad_batch_elements_are_named(net, opt, bad, words):
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt)
    with pytest.raises(TypeError) as info:
        step(np.ones((2, 32), np.float32), bad)
    for word in words:
        assert word in str(info.value)
    assert step.compile_count == 0


def test_empty_batch_is_rejected(net, opt):
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt)
    with pytest.raises(ValueError, match="at least one batch element"):
        step()


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_non_scalar_loss_is_explained(net, opt, jit):
    def forward(x):
        return net(x)

    step = TrainStep(forward, opt, jit=jit)
    with pytest.raises(ValueError, match="scalar loss"):
        step(ms.Tensor(np.ones((2, 32), np.float32)))


def test_reserved_aux_name_is_rejected(net, opt):
    def forward(x):
        loss = net(x).mean()
        return loss, {"step": loss}

    step = TrainStep(forward, opt)
    with pytest.raises(ValueError, match="reserved"):
        step(ms.Tensor(np.ones((2, 32), np.float32)))


def test_a_failed_eager_step_does_not_break_later_optimizer_updates(net, opt):
    """MindSpore 2.10 leaves PyNative's grad flag set after an exception under value_and_grad;
    a later plain AdamWeightDecay step then updates nothing unless the step cleans up."""
    def forward(x):
        return net(x)

    with pytest.raises(ValueError, match="scalar loss"):
        TrainStep(forward, opt, jit=False)(ms.Tensor(np.ones((2, 32), np.float32)))
    other = nn.Dense(3, 1)
    adamw = nn.AdamWeightDecay(other.trainable_params(), 1e-3)
    before = other.weight.asnumpy().copy()

    def loss(x):
        return other(x).sum()

    _, grads = ms.value_and_grad(loss, None, adamw.parameters)(ms.Tensor(np.ones((2, 3), np.float32)))
    adamw(grads)
    assert np.abs(other.weight.asnumpy() - before).max() > 1e-4
