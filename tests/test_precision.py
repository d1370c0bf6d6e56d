"""Precision policies: the value type, the levels, master weights, untouched integer inputs, dtypes."""
import mindspore as ms
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mindspore import nn

from conftest import batches
from mindstep import Precision, TrainStep
from mindstep.models import ConvNet, seeded
from mindstep.precision import plan

DT = st.sampled_from(["f32", "f16", "bf16"])


@given(p=DT, c=st.none() | DT, o=st.none() | DT)
def test_string_form_round_trips(p, c, o):
    policy = Precision(p, c, o)
    assert Precision.parse(str(policy)) == policy
    assert str(Precision.parse(str(policy))) == str(policy)


@pytest.mark.parametrize("text, expected", [
    ("p=f32", "p=f32,c=f32,o=f32"),
    ("p=f32,c=f16", "p=f32,c=f16,o=f16"),
    ("c=f16,o=f32", "p=f32,c=f16,o=f32"),
    ("o=f16", "p=f32,c=f32,o=f16"),
    (" p = f32 , c = bf16 ", "p=f32,c=bf16,o=bf16"),
], ids=["param-only", "output-follows-compute", "param-default", "output-only", "spaces"])
def test_missing_fields_cascade(text, expected):
    assert str(Precision.parse(text)) == expected


@pytest.mark.parametrize("text, words", [
    ("p=f64", ["Precision.param", "'f64'", "'bf16'", "'f16'", "'f32'"]),
    ("x=f16", ["keys", "'c'", "'o'", "'p'"]),
    ("p=f32,p=f16", ["at most once"]),
    ("pf32", ["key=dtype"]),
], ids=["bad-dtype", "bad-key", "repeated-key", "no-equals"])
def test_parse_errors_list_valid_keys_and_dtypes(text, words):
    with pytest.raises(ValueError) as info:
        Precision.parse(text)
    for word in words:
        assert word in str(info.value)


def test_precision_is_frozen():
    with pytest.raises(Exception):
        Precision("f32").compute = "f16"


@pytest.mark.parametrize("level, scope, dynamic", [("O0", "none", False), ("O1", "white-list", False),
                                                   ("O2", "all", True), ("O3", "all", True)])
def test_levels_are_aliases_onto_policies(level, scope, dynamic):
    p = plan(level)
    assert p.scope == scope and p.dynamic_loss_scale == dynamic
    assert p.policy.param == "f32" and p.policy.output == "f32"
    assert p.policy.compute == ("f32" if level == "O0" else "f16")


@pytest.mark.parametrize("bad, exc, words", [
    ("O4", ValueError, ["`precision`", "'O4'", "O2"]),
    (16, TypeError, ["`precision`", "16"]),
    ("p=f16,c=f16", ValueError, ["p=f32", "master weights"]),
    (Precision("f16"), ValueError, ["master weights"]),
])
def test_bad_precision_arguments(bad, exc, words):
    with pytest.raises(exc) as info:
        plan(bad)
    for word in words:
        assert word in str(info.value)


def test_bad_keep_fp32():
    with pytest.raises(TypeError, match="`keep_fp32`"):
        plan("O2", keep_fp32=[3])
    with pytest.raises(TypeError, match="`keep_fp32`"):
        plan("O2", keep_fp32=[int])


def test_bf16_on_cpu_is_refused_before_compiling():
    net = seeded(ConvNet)
    with pytest.raises(ValueError) as info:
        TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1), precision="p=f32,c=bf16,o=f32")
    assert "bf16" in str(info.value) and "CPU" in str(info.value)


class Probe(nn.Cell):
    """A conv net that also reports the dtypes it sees (as numbers: 16 or 32 bits)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="same")
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Dense(4, 10)

    def construct(self, x):
        h = self.bn(self.conv(x))
        return self.head(h.mean(axis=(2, 3)))


def bits(t):
    return ms.Tensor(16 if t.dtype == ms.float16 else 32, ms.int32)


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_master_weights_fp32_labels_untouched_and_loss_fp32(level, jit):
    ms.set_seed(0)
    net = Probe()
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        logits = net(x)
        loss = loss_fn(logits, y)
        label_int32 = ms.Tensor(1 if y.dtype == ms.int32 else 0, ms.int32)
        return loss, {"label_int32": label_int32, "label_sum": y.sum(), "logit_bits": bits(logits),
                      "loss_bits": bits(loss)}

    step = TrainStep(forward, nn.Momentum(net.trainable_params(), 0.01, 0.9), precision=level, jit=jit)
    (x, y), = batches(1, (4, 3, 8, 8))
    m = step(x, y)
    assert int(m["label_int32"]) == 1 and int(m["label_sum"]) == int(y.asnumpy().sum())
    assert int(m["loss_bits"]) == 32, "the loss is computed in float32 at every level"
    assert int(m["logit_bits"]) == (32 if level == "O0" else 16)
    assert all(p.dtype == ms.float32 for p in net.get_parameters()), "master weights stay float32"
    assert np.isfinite(float(m["loss"]))


def test_keep_fp32_by_type_and_by_name():
    net = Probe()
    step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1),
                              precision="O3", keep_fp32=[nn.BatchNorm2d, "head.*"])
    assert step.cast_cells["bn"] == "f32" and step.cast_cells["head"] == "f32"
    assert "conv" not in step.cast_cells or step.cast_cells["conv"] == "f16"
    net2 = Probe()
    o2 = TrainStep.from_net(net2, nn.CrossEntropyLoss(), nn.SGD(net2.trainable_params(), 0.1), precision="O2")
    assert o2.cast_cells["bn"] == "f32" and "head" not in o2.cast_cells


def test_o2_defaults_to_dynamic_loss_scale_unless_told_otherwise():
    net = Probe()
    opt = nn.SGD(net.trainable_params(), 0.1)
    assert TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, precision="O2").loss_scaler is not None
    net = Probe()
    opt = nn.SGD(net.trainable_params(), 0.1)
    assert TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, precision="O2", loss_scale=None).loss_scaler is None
    net = Probe()
    opt = nn.SGD(net.trainable_params(), 0.1)
    assert TrainStep.from_net(net, nn.CrossEntropyLoss(), opt, precision="O1").loss_scaler is None


def test_every_level_trains_a_conv_net_with_batchnorm_to_comparable_losses():
    (x, y), = batches(1, (16, 3, 8, 8), seed=4)
    final = {}
    for level in ["O0", "O1", "O2", "O3"]:
        net = seeded(ConvNet)
        step = TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9),
                                  precision=level)
        losses = [float(step(x, y)["loss"]) for _ in range(25)]
        assert all(np.isfinite(losses)), level
        assert losses[-1] < 0.8 * losses[0], (level, losses[0], losses[-1])
        final[level] = losses
        assert step.compile_count == 1
    for level in ["O1", "O2", "O3"]:
        assert abs(final[level][0] - final["O0"][0]) < 1e-2 * final["O0"][0], "same start, fp16 rounding only"
        assert abs(final[level][-1] - final["O0"][-1]) < 1e-2 * final["O0"][-1]
