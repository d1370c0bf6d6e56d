"""The short MindSpore scripts behind the doctor's rules (each rule's `evidence` names its case).

    python tools/doctor_evidence.py            # every case, one RESULT line each
    python tools/doctor_evidence.py list_arg cell_arg

Facts (what a call returns, whether it prints) are checked by tests/test_doctor_corpus.py; the
timing cases (`scalar_arg`, `list_arg`, `cell_arg`) print seconds per call, first call included,
for a reader to compare (a recompile costs what the first call cost; a cached call ~1 ms).
"""
from __future__ import annotations

import random
import sys
import time

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

ms.set_context(mode=ms.GRAPH_MODE)
X = Tensor(np.ones((2, 16), np.float32))


def _mlp():
    return nn.SequentialCell([nn.Dense(16, 16) for _ in range(20)])


def _timed(fn, *args, digits=3) -> float:
    t = time.perf_counter()
    out = fn(*args)
    (out[0] if isinstance(out, tuple) else out).asnumpy()
    return round(time.perf_counter() - t, digits)


def _first(cell, calls=3) -> list:
    return [float(cell(X).asnumpy().ravel()[0]) for _ in range(calls)]


def case_print():
    class Net(nn.Cell):
        def construct(self, x):
            print(x.shape)
            print("const message")
            return x + 1
    _first(Net())
    return "see the lines above: (2, 16) and 'const message' once per call"


def case_dead_print():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.kind = "l2"

        def construct(self, x):
            if self.kind == "l1":
                print("DEAD BRANCH PRINTED")
            if len(x.shape) != 2:
                print("DEAD SHAPE PRINTED")
            return x * 2
    return _first(Net())


def case_param_item():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.it = Parameter(Tensor(np.array(3.0, np.float32)), requires_grad=False)

        def construct(self, x):
            return x * self.it.item()
    return _first(Net())


def case_np_random():
    class Net(nn.Cell):
        def construct(self, x):
            return x + Tensor(np.random.rand(), ms.float32)
    return _first(Net())


def case_py_random():
    class Net(nn.Cell):
        def construct(self, x):
            return x + random.random()
    return _first(Net())


def case_shape_ints():
    class Inner(nn.Cell):
        def construct(self, x, b, h):
            return x + Tensor(np.zeros((b, h)), ms.float32)

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def construct(self, x):
            b, h = x.shape
            return self.inner(x, b, h)
    return _first(Outer())


def case_dict_update():
    class Net(nn.Cell):
        def construct(self, x):
            out = {"loss": x.sum()}
            out.update({"m": x.mean()})
            return out
    net = Net()
    return [{k: float(v.asnumpy()) for k, v in net(X * i).items()} for i in range(3)]


def case_dict_unpack():
    class Net(nn.Cell):
        def construct(self, x):
            aux = {"m": x.mean()}
            return {"loss": x.sum(), **aux}
    return sorted(str(k) for k in Net()(X))


def case_half_label():
    logits = Tensor(np.zeros((2, 3000), np.float32))
    label = Tensor(np.array([1, 2049]), ms.int32)
    try:
        nn.CrossEntropyLoss()(logits, ops.cast(label, ms.float16))
        result = "runs"
    except Exception as err:
        result = f"{type(err).__name__}: {str(err).splitlines()[0][:90]}"
    return {"CrossEntropyLoss(float16 labels)": result, "float16(2049)": float(np.float16(2049))}


_LOG = []


def case_global_append():
    @ms.jit
    def step(x):
        _LOG.append(x)
        return x + 1
    for _ in range(3):
        step(X)
    return len(_LOG)


SCALE = 2.0


def case_stale_global():
    global SCALE

    @ms.jit
    def step(x):
        return x * SCALE
    first = float(step(X).asnumpy()[0, 0])
    SCALE = 3.0
    return [first, float(step(X).asnumpy()[0, 0])]


def case_control_depend():
    from mindspore.ops import functional as F
    return [hasattr(ops, "control_depend"), hasattr(F, "control_depend")]


def case_scalar_arg():
    net = _mlp()

    @ms.jit
    def step(x, lr):
        return net(x) * lr
    python = [_timed(step, X, 1.0 / (epoch + 1)) for epoch in range(4)]
    tensor = [_timed(step, X, Tensor(1.0 / (epoch + 1), ms.float32)) for epoch in range(4)]
    return {"python float": python, "Tensor": tensor}


def case_list_arg():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = _mlp()

        @ms.jit
        def step(self, x, idx):
            return self.body(x)[:, idx[0]]
    net = Net()
    new = [_timed(net.step, X, Tensor(np.array([i, 0])).asnumpy().tolist()) for i in range(4)]
    same = [_timed(net.step, X, [0, 0]) for _ in range(4)]
    tensor = [_timed(net.step, X, Tensor(np.array([i, 0]))) for i in range(4)]
    body = _mlp()

    @ms.jit
    def pair(xs):
        return body(xs[0]) + xs[1]
    tensors = [_timed(pair, [X, X]) for _ in range(4)]
    mutable = [_timed(pair, ms.mutable([X, X])) for _ in range(4)]
    return {"new lists": new, "the same list": same, "Tensor": tensor, "list of Tensors": tensors,
            "ms.mutable(list of Tensors)": mutable}


def case_asnumpy():
    @ms.jit
    def synced(x):
        return ops.ones((2,)) * float(x.asnumpy())

    @ms.jit
    def graph(x):
        return ops.ones((2,)) * x

    calls = {name: [_timed(fn, Tensor([float(i)], ms.float32), digits=4) for i in range(5)] for name, fn in
             (("asnumpy in jit", synced), ("tensor math", graph))}

    def strict(x):
        return ops.ones((2,)) * float(x.asnumpy())
    try:
        ms.jit(strict, fullgraph=True)(Tensor([1.0], ms.float32))
        calls["fullgraph=True"] = "runs"
    except Exception as err:
        calls["fullgraph=True"] = f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"
    return calls


def case_cell_arg():
    net = _mlp()

    @ms.jit
    def run(cell, x):
        return cell(x)

    @ms.jit
    def closed(x):
        return net(x)
    return {"Cell argument": [_timed(run, net, X) for _ in range(4)], "closed over": [_timed(closed, X) for _ in range(4)]}


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def main(argv) -> int:
    unknown = [a for a in argv if a not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    for name in argv or CASES:
        try:
            result = CASES[name]()
        except Exception as err:  # the failure is the evidence
            result = f"FAILS {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        print(f"RESULT {name}: {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
