"""Idioms of MindSpore's tutorials inside a step: refused or warned when the step is built, at the
user's line (`mindstep._porting`), with no alarm on the look-alikes that train right; the tutorials'
`(loss, logits)` returns accepted; mindstep's own checks reported in its own words."""
import linecache
import re
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import amp, nn

import mindstep
from mindstep import PortingWarning, TrainStep
from mindstep.models import MLP, seeded

X = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
Y = (np.arange(8) % 10).astype(np.int32)
LOSS = nn.CrossEntropyLoss()
NET = seeded(MLP)
SCALER = amp.DynamicLossScaler(scale_value=2 ** 16, scale_factor=2, scale_window=50)
ACCUMULATE_STEP = 2  # the accumulation tutorial's global
BATCH_SIZE = 32


def opt():
    return nn.SGD(NET.trainable_params(), 0.01)


def line_of(tag: str) -> int:
    """The line of this file that ends with the comment `# <tag>` (the line a check must name)."""
    lines = [i for i, line in enumerate(linecache.getlines(__file__), start=1) if line.rstrip().endswith(f"# {tag}")]
    assert len(lines) == 1, tag
    return lines[0]


# ---- a loss scaler called in forward (the mixed-precision tutorial) ----------------------------

def scaled_forward(x, y):
    logits = NET(x)
    loss = LOSS(logits, y)
    loss = SCALER.scale(loss)  # scale-global
    return loss, logits


class Model:
    def __init__(self):
        self.net, self.scaler = NET, SCALER

    def forward(self, x, y):
        return self.scaler.unscale(LOSS(self.net(x), y))  # unscale-attr


def helper_scaled(x, y):
    return SCALER.scale(LOSS(NET(x), y))  # scale-helper


def forward_via_helper(x, y):
    return helper_scaled(x, y)


@pytest.mark.parametrize("forward, marker, method", [
    pytest.param(scaled_forward, "scale-global", "scale", id="global"),
    pytest.param(Model().forward, "unscale-attr", "unscale", id="attribute-unscale"),
    pytest.param(forward_via_helper, "scale-helper", "scale", id="helper"),
])
@pytest.mark.parametrize("kwargs", [{"loss_scale": SCALER}, {"precision": "O2"}, {}],
                         ids=["step-scaler", "O2-default-scale", "no-step-scale"])
def test_a_loss_scaler_called_in_forward_is_refused_at_its_line(forward, marker, method, kwargs):
    with pytest.raises(ValueError) as info:
        TrainStep(forward, opt(), **kwargs)
    text = str(info.value)
    assert f"`{method}` at {__file__}:{line_of(marker)}" in text
    assert "loss_scale=loss_scaler" in text and "MindSpore:" not in text


class Scale:
    """A user object with a `scale` method: not a loss scaler."""

    factor = 0.5

    def scale(self, loss):
        return loss * self.factor


USER_SCALE = Scale()


def user_scaled_forward(x, y):
    return USER_SCALE.scale(LOSS(NET(x), y))


def test_a_scale_method_of_another_object_is_not_a_loss_scaler():
    step = TrainStep(user_scaled_forward, opt(), loss_scale=SCALER, jit=False)
    assert float(step(X, Y)["loss"]) > 0


def test_a_gan_loss_calling_a_loss_scaler_is_refused():
    g, d = nn.Dense(4, 4), nn.Dense(4, 1)
    g.update_parameters_name("g.")
    d.update_parameters_name("d.")

    def d_loss(fake, real):
        return SCALER.scale((d(fake) - d(real)).mean())

    def g_loss(fake, real):
        return -d(fake).mean()

    with pytest.raises(ValueError, match=r"GANStep: .*`scale` at .*d_options=\{'loss_scale': loss_scaler\}"):
        mindstep.GANStep(g, d, d_loss, g_loss, nn.SGD(d.trainable_params(), 0.1), nn.SGD(g.trainable_params(), 0.1))


# ---- the loss divided by the accumulation steps (the accumulation tutorial) ---------------------

def divided_by_global(x, y):
    logits = NET(x)
    loss = LOSS(logits, y)
    return loss / ACCUMULATE_STEP  # div-global


def divided_by_constant(x, y):
    return LOSS(NET(x), y) / 4  # div-constant


def divided_in_place(x, y):
    loss = LOSS(NET(x), y)
    loss /= ACCUMULATE_STEP  # div-in-place
    return loss, NET(x)


class Trainer:
    accum_steps = 2

    def forward(self, x, y):
        loss = LOSS(NET(x), y) / self.accum_steps  # div-attribute
        return loss


def closure_forward():
    steps = 2

    def forward(x, y):
        return LOSS(NET(x), y) / steps  # div-closure

    return forward


@pytest.mark.parametrize("forward, k, marker", [
    pytest.param(divided_by_global, 2, "div-global", id="global"),
    pytest.param(divided_by_constant, 4, "div-constant", id="constant"),
    pytest.param(divided_in_place, 2, "div-in-place", id="in-place"),
    pytest.param(Trainer().forward, 2, "div-attribute", id="attribute"),
    pytest.param(closure_forward(), 2, "div-closure", id="closure"),
])
def test_a_loss_divided_by_the_accumulation_steps_warns_at_its_line(forward, k, marker):
    with pytest.warns(PortingWarning, match=rf"accumulate={k}") as record:
        TrainStep(forward, opt(), accumulate=k)
    assert len(record) == 1
    assert record[0].filename == __file__ and record[0].lineno == line_of(marker)
    assert "remove the division" in str(record[0].message)


def divided_by_token_count(x, y, mask):
    return (LOSS(NET(x), y) * mask).sum() / mask.sum()


def divided_by_batch_size(x, y):
    return LOSS(NET(x), y) / x.shape[0]


def divided_by_other_global(x, y):
    return LOSS(NET(x), y) / BATCH_SIZE


def divided_by_local(x, y):
    n = 2
    return LOSS(NET(x), y) / n


@pytest.mark.parametrize("forward, k", [
    pytest.param(divided_by_token_count, 2, id="token-count"),
    pytest.param(divided_by_batch_size, 2, id="batch-size"),
    pytest.param(divided_by_other_global, 2, id="other-global"),
    pytest.param(divided_by_local, 2, id="local-variable"),
    pytest.param(divided_by_global, 1, id="no-accumulation"),
    pytest.param(divided_by_global, 4, id="other-k"),
])
def test_no_warning_for_divisions_that_are_not_the_accumulation_steps(forward, k):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainStep(forward, opt(), accumulate=k)


# ---- a network converted twice --------------------------------------------------------------------

def _converted(how: str) -> nn.Cell:
    net = nn.SequentialCell(nn.Dense(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dense(16, 4))
    if how == "auto-O2":
        return amp.auto_mixed_precision(net, "O2")  # converts
    if how == "custom-black":
        return amp.custom_mixed_precision(net, black_list=[nn.BatchNorm1d])
    if how == "custom-white":
        return amp.custom_mixed_precision(net, white_list=[nn.Dense])
    return net.to_float(ms.float16)


@pytest.mark.parametrize("how, words", [
    ("auto-O2", "auto_mixed_precision(..., 'O2')"),
    ("custom-black", "custom_mixed_precision(...)"),
    ("custom-white", "custom_mixed_precision(...) (a network rewritten with casts)"),
    ("to-float", "to_float(float16)"),
])
def test_precision_on_a_network_already_converted_is_refused(how, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MindSpore's rewrite (custom white list) writes its classes to the working folder
    net = _converted(how)

    def forward(x, y):
        return LOSS(net(x), y)

    with pytest.raises(ValueError) as info:
        TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), precision="O2")
    text = str(info.value)
    assert words in text and "precision='O2'" in text and "Keep one" in text
    # the line of the test file that converts is named
    assert re.search(rf"{re.escape(__file__)}:{line_of('converts')}", text)


def test_a_converted_network_without_precision_and_mindsteps_own_conversion_are_accepted():
    net = _converted("auto-O2")

    def forward(x, y):
        return LOSS(net(x), y)

    TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), loss_scale=SCALER)
    plain = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))

    def forward2(x, y):
        return LOSS(plain(x), y)

    for _ in range(2):  # the second step finds the first one's float16 cells: its own conversion
        TrainStep(forward2, nn.SGD(plain.trainable_params(), 0.1), precision="O2")


# ---- `(loss, logits)` returns, and mindstep's own errors ---------------------------------------------

@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_tutorial_returns_come_back_as_positional_aux_metrics(jit):
    net = seeded(MLP)

    def forward(x, y):
        logits = net(x)
        return LOSS(logits, y), logits, logits.argmax(1)

    expected = net(ms.Tensor(X)).asnumpy()  # the forward's logits are the weights' before the update
    m = TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), jit=jit)(X, Y)
    assert {"aux1", "aux2"} <= set(m)
    np.testing.assert_allclose(m["aux1"].asnumpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m["aux2"].asnumpy(), expected.argmax(1))


def test_token_count_pair_with_aux_outputs():
    net = seeded(MLP)
    ce = nn.CrossEntropyLoss(reduction="none")

    def forward(x, y):
        logits = net(x)
        return (ce(logits, y).sum(), ms.Tensor(8.0)), logits

    m = TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), normalize="count")(X, Y)
    assert m["aux1"].shape == (8, 10)
    assert float(m["loss"]) == pytest.approx(float(LOSS(seeded(MLP)(ms.Tensor(X)), ms.Tensor(Y))), rel=1e-5)


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_a_structure_forward_cannot_return_is_refused_in_mindsteps_words(jit):
    net = seeded(MLP)

    def forward(x, y):
        return LOSS(net(x), y), 3

    with pytest.raises(ValueError) as info:
        TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), jit=jit)(X, Y)
    text = str(info.value)
    assert text.startswith("TrainStep: forward returned a tuple whose items after the loss are not all tensors")
    assert "MindSpore:" not in text and "Check that forward(*batch)" not in text
