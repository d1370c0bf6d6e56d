"""Bad input never escapes as a MindSpore C++ traceback, and leaves the step working.

A batch the forward cannot take gives one TypeError/ValueError naming what the step first ran on,
what it got, MindSpore's one-line reason and the fix; invalid TrainStep arguments name the argument
and change nothing (property tests with hypothesis)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mindspore import nn

from conftest import params_np
from mindstep import TrainStep
from mindstep.models import MLP, seeded

X = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 10


def make(**kwargs):
    net = seeded(MLP)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    return net, TrainStep(forward, nn.SGD(net.trainable_params(), 0.1), **kwargs)


def reference_loss():
    return float(make(jit=False)[1](X, Y)["loss"])


def assert_clean(error):
    text = str(error)
    assert "C++" not in text and "Traceback" not in text and len(text.splitlines()) == 1, text
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
@pytest.mark.parametrize("batch, error, words", [
    ((np.ones((8, 31), np.float32), Y), ValueError, ["batch[0] Float32 (8, 31)", "MatMul", "forward(*batch)"]),
    ((np.ones((8, 2, 32), np.float32), Y), ValueError, ["(8, 2, 32)", "rank"]),
    ((X, Y.astype(np.float32)), TypeError, ["batch[1] Float32 (8,)", "Int32"]),
    ((X, "labels"), TypeError, ["`batch[1]`", "'labels'"]),
    ((X, None), TypeError, ["`batch[1]`", "None"]),
    ((X, [[1, 2], [3]]), TypeError, ["`batch[1]`", "list"]),
    ((np.array(["a", "b"]), Y), TypeError, ["`batch[0]`", "<U1", "strings to ids"]),
    ((np.ones((0, 32), np.float32), Y), ValueError, ["`batch[0]`", "(0, 32)", "skip empty batches"]),
], ids=["feature-size", "rank", "label-dtype", "string", "none", "ragged-list", "string-array", "empty"])
def test_a_batch_the_forward_cannot_take_is_one_clear_error(batch, error, words, jit):
    net, step = make(jit=jit)
    with pytest.raises(error) as info:
        step(*batch)
    for word in words:
        assert word in str(info.value), str(info.value)
    assert_clean(info.value)
    assert float(step(X, Y)["loss"]) == pytest.approx(reference_loss(), rel=1e-5), "the step still works"


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_after_the_first_call_the_error_names_the_shapes_it_ran_on(jit):
    _, step = make(jit=jit)
    step(X, Y)
    with pytest.raises(ValueError) as info:
        step(np.ones((8, 33), np.float32), Y)
    text = str(info.value)
    assert "first ran on batch[0] Float32 (8, 32), batch[1] Int32 (8,)" in text
    assert "got batch[0] Float32 (8, 33)" in text and "recompiles once" in text
    assert_clean(info.value)
    step(X[:5], Y[:5])  # a smaller last batch the forward accepts still runs (one recompile)
    assert step.compile_count == (2 if jit else 0)


BAD_ELEMENTS = st.one_of(
    st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=3),
    st.builds(lambda n: np.ones((n, 32), np.float32), st.sampled_from([0])),
    st.builds(lambda k: np.ones((8, k), np.float32), st.integers(1, 40).filter(lambda k: k != 32)),
    st.builds(lambda: np.array([object()], dtype=object)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD_ELEMENTS, position=st.sampled_from([0, 1]))
def test_any_invalid_batch_element_raises_type_or_value_error_and_changes_nothing(bad, position):
    # an (8, 10) float array as the labels is not invalid: nn.CrossEntropyLoss takes it as class
    # probabilities for the MLP's 10 classes (the generator drew it in a fresh-clone run and nothing raised)
    assume(not (position == 1 and isinstance(bad, np.ndarray) and bad.shape == (8, 10)))
    net, step = make(jit=False)  # eager keeps the examples fast; the compiled path has the tests above
    step(X, Y)
    before = params_np(net.get_parameters())
    batch = [X, Y]
    batch[position] = bad
    with pytest.raises((TypeError, ValueError)) as info:
        step(*batch)
    assert f"batch[{position}]" in str(info.value)
    assert_clean(info.value)
    after = params_np(net.get_parameters())
    assert all(np.array_equal(before[n], after[n]) for n in before)
    assert np.isfinite(float(step(X, Y)["loss"]))


INVALID_ARGUMENTS = st.one_of(
    st.tuples(st.just("accumulate"), st.one_of(st.integers(max_value=0), st.floats(), st.text(max_size=2))),
    st.tuples(st.just("clip_grad_norm"), st.one_of(st.floats(max_value=0), st.just(float("inf")),
                                                   st.just(float("nan")), st.text(max_size=2))),
    st.tuples(st.just("ema"), st.one_of(st.floats(min_value=1.0), st.floats(max_value=0.0), st.text(max_size=2))),
    st.tuples(st.just("precision"), st.sampled_from(["O4", "fp8", "p=f16", "", 3])),
    st.tuples(st.just("loss_scale"), st.one_of(st.floats(max_value=0.99), st.sampled_from(["static", []]))),
    st.tuples(st.just("on_nonfinite"), st.sampled_from(["ignore", None, 1])),
    st.tuples(st.just("compiler"), st.sampled_from(["graph", "", None])),
    st.tuples(st.just("normalize"), st.sampled_from(["sum", "tokens", 0])),
    st.tuples(st.just("name"), st.sampled_from(["", "1x", "a.b", None])),
)


@settings(max_examples=40, deadline=None)
@given(argument=INVALID_ARGUMENTS)
def test_any_invalid_train_step_argument_is_named_and_the_net_is_left_alone(argument):
    name, value = argument
    net = seeded(MLP)
    opt = nn.SGD(net.trainable_params(), 0.1)
    before = params_np(net.get_parameters())
    flags = [(c, c.training, c.mixed_precision_type) for _, c in net.cells_and_names()]
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    with pytest.raises((TypeError, ValueError)) as info:
        TrainStep(forward, opt, **{name: value})
    assert f"`{name}`" in str(info.value), str(info.value)
    assert all((c.training, c.mixed_precision_type) == (t, m) for c, t, m in flags), \
        "a refused step must not change the training mode or the precision"
    assert all(np.array_equal(before[n], v) for n, v in params_np(net.get_parameters()).items())
    step = TrainStep(forward, opt, jit=False)
    assert float(step(X, Y)["loss"]) == pytest.approx(reference_loss(), rel=1e-5)
