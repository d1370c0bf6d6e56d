"""mindstep.Dropout: a counter-based mask whose state is a Parameter (so checkpoints resume it)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import mindstep
from mindstep.dropout import Dropout, mix32, mix32_reference

MODES = [pytest.param(ms.PYNATIVE_MODE, id="pynative"), pytest.param(ms.GRAPH_MODE, id="graph")]


@pytest.mark.parametrize("mode", MODES)
def test_int32_hash_equals_the_uint32_reference(mode):
    x = (np.arange(-3000, 3000, dtype=np.int64) * 716_809 + 12_345).astype(np.int32)

    class Hash(nn.Cell):
        def construct(self, v):
            return mix32(v)

    ms.set_context(mode=mode)
    try:
        got = Hash()(ms.Tensor(x)).asnumpy().astype(np.uint32)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_array_equal(got, mix32_reference(x))


def test_masks_keep_one_minus_p_scale_the_kept_and_change_every_call():
    drop = Dropout(0.3, seed=7)
    drop.set_train(True)
    x = ms.Tensor(np.ones((64, 256), np.float32))
    a, b = drop(x).asnumpy(), drop(x).asnumpy()
    assert abs((a > 0).mean() - 0.7) < 0.01 and abs((b > 0).mean() - 0.7) < 0.01
    np.testing.assert_allclose(a[a > 0], 1 / 0.7, rtol=1e-6)
    assert not np.array_equal(a > 0, b > 0)
    assert int(drop.calls.asnumpy()) == 2


def test_the_same_seed_and_counter_give_the_same_mask_in_graph_and_pynative():
    x = ms.Tensor(np.ones((16, 32), np.float32))
    drop = Dropout(0.5, seed=3)
    drop.set_train(True)
    eager = drop(x).asnumpy()
    drop.calls.set_data(ms.Tensor(0, ms.int32))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        graph = drop(x).asnumpy()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_array_equal(graph, eager)


def test_inference_mode_and_p_zero_pass_the_input_through():
    x = ms.Tensor(np.ones((4, 8), np.float32))
    drop = Dropout(0.5)
    drop.set_train(False)
    np.testing.assert_array_equal(drop(x).asnumpy(), x.asnumpy())
    zero = Dropout(0.0)
    zero.set_train(True)
    np.testing.assert_array_equal(zero(x).asnumpy(), x.asnumpy())
    assert int(drop.calls.asnumpy()) == 0


def test_two_builds_after_the_same_seed_draw_the_same_masks():
    masks = []
    for _ in range(2):
        ms.set_seed(5)
        net = nn.SequentialCell(Dropout(0.5), Dropout(0.5))
        net.set_train(True)
        masks.append(net(ms.Tensor(np.ones((8, 8), np.float32))).asnumpy())
    np.testing.assert_array_equal(masks[0], masks[1])


def test_resumable_dropout_swaps_nn_dropout_with_named_state():
    net = nn.SequentialCell(nn.Dense(4, 4), nn.Dropout(p=0.25), nn.SequentialCell(nn.Dropout(p=0.1)))
    replaced = mindstep.resumable_dropout(net)
    assert replaced == ["1", "2.0"]
    assert [type(c).__name__ for _, c in net.cells_and_names()].count("Dropout") == 2
    assert isinstance(net[1], Dropout) and net[1].p == 0.25
    names = [p.name for p in net.get_parameters()]
    assert {"1.seed", "1.calls", "2.0.seed", "2.0.calls"} <= set(names)


@pytest.mark.parametrize("bad, error", [(1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError)])
def test_dropout_p_is_validated(bad, error):
    with pytest.raises(error, match="`p`"):
        Dropout(bad)
