"""The doctor's rules: stable ids, severity, what goes wrong at run time, the fix, and the
measurement that backs the claim.

Severity means one thing each: `error` where MindSpore 2.10 fails or computes a wrong result
(measured); `warning` where it works but recompiles, syncs with the host or slows; `note` for style;
`info` for a file the doctor could not read. `python tools/doctor_evidence.py` re-runs the short
MindSpore scripts behind the rules that carry a measurement (`evidence`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    message: str
    fix: str
    evidence: str = ""


_RULES = [
    Rule("MS000", "unreadable-file", "info",
         "could not be read or parsed as Python 3, so it was not checked (the reason follows); the run went on "
         "with the other files",
         "if this file is Python 3 that Python itself runs, report it; otherwise (Python 2, a template, a "
         "deliberately broken fixture) exclude it from the paths you check"),
    Rule("MS001", "global-mutation", "error",
         "mutates Python state outside the compiled function (a global/outer list, dict or variable); "
         "MindSpore compiles the function once and silently drops the mutation (an append to a global list "
         "inside jit leaves it empty)",
         "keep changing state in mindspore.Parameter objects updated with ops.assign/ops.assign_add, or return "
         "the value and store it on the host; mindstep.TrainStep keeps all step state in Parameters",
         "tools/doctor_evidence.py `global_append`: a jitted function that appends to a module-level list "
         "returns normally and the list stays empty after 3 calls"),
    Rule("MS002", "stale-global", "error",
         "reads a module-level variable that is reassigned elsewhere; the compiled function baked in the value "
         "it saw at compile time and keeps using it, with no recompile and no warning",
         "pass the value as a Tensor argument, or keep it in a Parameter and update it with ops.assign",
         "tools/doctor_evidence.py `stale_global`: a jitted function reading a module-level float returns "
         "the first value after the global is rebound (x * 2.0 stays x * 2.0 after scale = 3.0). A global set "
         "once while the network is built (in __init__, before anything compiles) is read at that value and "
         "is not reported"),
    Rule("MS003", "python-scalar-arg", "warning",
         "passes a Python number that changes every call to a jitted function; every new value is a new "
         "constant and recompiles the graph (about 1 s each)",
         "pass ms.Tensor(value) (or ms.mutable(value)) instead; mindstep.TrainStep converts scalars to tensors",
         "tools/doctor_evidence.py `scalar_arg`: a 20-layer MLP step called with 1.0 / (epoch + 1) compiles "
         "again for every new value (each call as slow as the first); with ms.Tensor(value) only the first "
         "call compiles"),
    Rule("MS004", "lambda-in-jit", "error",
         "writes a lambda inside the call to jit/value_and_grad/grad of compiled code, or passes map/filter a "
         "lambda that reads a free variable; MindSpore 2.10 fails with 'Parse Lambda Function Fail ... make "
         "sure it is defined on a separate line' ('Map operator don't support Closure with free variable')",
         "define the function with def (def forward(x, y): return loss_fn(net(x), y)), or bind the lambda to a "
         "name on its own line first",
         "measured on MindSpore 2.10 when the rule was written: the two error messages quoted above"),
    Rule("MS005", "load-after-jit", "error",
         "writes weights from the host (load_param_into_net / load_checkpoint / set_data) after a jitted function "
         "that uses them has run, and runs it again; a compiled ms.jit function keeps its own copy and silently "
         "ignores the new weights",
         "load before the first jitted call, or write with ops.assign(p, value); mindstep.TrainStep's default "
         "GRAPH_MODE cell sees host writes and its function compiler re-syncs them",
         "measured when mindstep's function compiler was built (docs/design/step.md): the compiled "
         "function kept the weights it was compiled with after load_param_into_net"),
    Rule("MS006", "trace-capture", "error",
         "compiles a training step with capture_mode='trace'; MindSpore 2.10 replays the traced graph without "
         "its side effects: it updates once, then returns a constant loss with no parameter updates",
         "use the default capture_mode ('ast') or mindstep.TrainStep",
         "measured on MindSpore 2.10 when the rule was written: after the first call the traced step returned "
         "the same loss and left the Parameters unchanged"),
    Rule("MS007", "host-accumulation", "error",
         "accumulates gradients by rebinding a Python list or branches on a host integer (step % k) inside "
         "compiled code; the list does not persist between calls (nothing accumulates) and each new step value "
         "recompiles",
         "keep accumulators in Parameters with ops.assign_add and an int32 counter Parameter; or use "
         "mindstep.TrainStep(..., accumulate=k)",
         "the accumulation step of the Chinese field guide our users learn from (section 6.2), run as written: the rebound list "
         "is new on every call, and `step % accum_steps` with a Python step compiles once per step value"),
    Rule("MS008", "half-cast-label", "error",
         "casts integer labels/masks/ids to float16 or bfloat16; class indices and masks must stay integers "
         "(fp16 cannot even represent every index above 2048)",
         "cast only floating inputs; mindstep's precision policies never cast integer inputs",
         "tools/doctor_evidence.py `half_label`: nn.CrossEntropyLoss given float16 class indices fails ('the "
         "labels should be Int32, but got float16'), in jit too; and float16 holds every integer only up to "
         "2048 (2049 becomes 2048), so an index used elsewhere is wrong above it. Reported on evidence only: the value is "
         "an integer (int cast, argmax) or is used as an index or class label, in the same function or in "
         "the value_and_grad forward it is passed to"),
    Rule("MS009", "state-name-collision", "error",
         "names a Parameter with a prefix that MindSpore optimizers use for their own state (accum., moment1., "
         "moments., global_step, ...); under jit this fails with \"its name '...' already exists\"",
         "use a unique prefix such as 'mystep.acc.' (mindstep uses '<name>.' for all its state)",
         "measured on MindSpore 2.10 when the rule was written: the clash needs the Parameter and an optimizer "
         "with that state compiled in one ms.jit function (a GRAPH_MODE TrainOneStepCell ran with the same "
         "names); so it is reported where the project jits"),
    Rule("MS010", "host-sync-in-jit", "warning",
         "calls asnumpy()/item()/tolist() or numpy on tensors inside compiled code; this falls back to the "
         "Python interpreter, syncs with the host, and fails under fullgraph=True ('cannot get attributes "
         "asnumpy')",
         "use mindspore.ops for tensor math inside the step; read values on the host after the call",
         "tools/doctor_evidence.py `asnumpy`: float(x.asnumpy()) in a jitted function runs through JIT Fallback "
         "on the host each call and fails with fullgraph=True ('In JIT strict mode, cannot get attributes "
         "asnumpy'); `param_item` and `shape_ints`: Parameter.item() inside construct compiles "
         "and is not reported; np.zeros((B, H, W)) with B, H, W the Python ints a parent Cell passes "
         "(from x.shape) is a compile-time constant and is not reported; numpy on a tensor's values is"),
    Rule("MS011", "scheduler-step-in-jit", "error",
         "calls an LR scheduler's step() inside compiled code; MindSpore 2.10 fails ('Data type conversion is "
         "not supported for a Parameter ... Float64')",
         "call scheduler.step() on the host after the step, or use mindstep.schedules evaluated in the graph",
         "measured on MindSpore 2.10 when the rule was written (the error above)"),
    Rule("MS012", "allreduce-order", "error",
         "all-reduces after the optimizer update or without averaging; the ranks then apply different or "
         "world-size-times-too-large updates",
         "reduce gradients before the optimizer with nn.DistributedGradReducer (gradients_mean=True), or divide "
         "the all-reduced sum by the group size",
         "arithmetic: an update applied before the reduction differs per rank; a sum of W gradients is W "
         "times the mean (tests/dp_cases.py checks mindstep's reduction against one process on the whole batch)"),
    Rule("MS013", "print-in-jit", "warning",
         "print inside compiled code becomes a graph Print op that prints on every call to C-level stdout "
         "(not capturable with redirect_stdout)",
         "return the values as outputs (mindstep: aux metrics) or use TrainStep(debug=True)",
         "tools/doctor_evidence.py `print` and `dead_print`: print(x.shape) and print('const') in a GRAPH_MODE "
         "construct print on each of 3 calls; a print in a branch decided at compile time that is not taken "
         "prints nothing. So a print with a message (an error message for a bad shape or config, an overflow "
         "log) under an if or after an early return is not reported; a print of bare values is, wherever it is"),
    Rule("MS014", "dict-unpack-in-jit", "error",
         "builds a dict with ** unpacking ({'loss': loss, **aux}) inside compiled code; MindSpore 2.10 returns "
         "the unpacked entries under one tuple key ((('m',),) instead of 'm'), with no error, and a later "
         "lookup of 'm' fails ('The key m does not exist')",
         "add the entries one by one or with dict.update (out = {'loss': loss}; out.update(aux): measured "
         "correct), or return a tuple and name the values on the host",
         "tools/doctor_evidence.py `dict_unpack` and `dict_update`: {'loss': x.sum(), **aux} in a GRAPH_MODE "
         "construct returned {'loss': ..., (('m',),): (...)}; out.update(...) returned the right values on each "
         "of 3 calls (this rule reported dict.update before round 3; that claim did not reproduce on 2.10)"),
    Rule("MS015", "jit-takes-cells", "warning",
         "a jitted function takes the network/optimizer/loss as arguments; a Cell passed to ms.jit compiles the "
         "function again on every call, even when it is the same Cell (the result is right, the time is not)",
         "close over the network and optimizer instead of passing them (def train_step(x, y): ... opt(grads))",
         "tools/doctor_evidence.py `cell_arg`: run(net, x) with a 20-layer MLP took 0.23 s on every call, the "
         "same Cell each time, against 0.001 s for the same function closing over net; MindSpore's log shows "
         "one compile per call (3 calls: 3x the compile lines of the closure)"),
    Rule("MS016", "control-depend", "error",
         "calls ops.control_depend, which does not exist in MindSpore 2.x (AttributeError)",
         "order side effects with ops.depend(value, side_effect)",
         "tools/doctor_evidence.py `control_depend`: neither mindspore.ops nor mindspore.ops.functional has "
         "control_depend in MindSpore 2.10"),
    Rule("MS017", "jit-list-arg", "warning",
         "passes a Python list to a jitted function or method every call (a list literal, a comprehension, "
         "list(...) or .tolist()); MindSpore compiles the function again on every call that gets a list, even "
         "the same values",
         "wrap the list in ms.mutable(...) (a list of Tensors), or pass a Tensor (ms.Tensor(values)) for "
         "numbers that change per batch",
         "tools/doctor_evidence.py `list_arg`: a @jit method of a 20-layer MLP called with "
         "Tensor(...).asnumpy().tolist() took 0.26-0.32 s on every call (the same list [0, 0] too), against "
         "0.001 s after the first call with a Tensor; a list of two Tensors took 0.24 s on every call, "
         "ms.mutable of the same list 0.001 s after the first"),
    Rule("MS018", "host-random-in-graph", "error",
         "draws numpy or Python random numbers (np.random.rand(), random.random()) inside compiled code; graph "
         "compilation draws them once and folds them in as a constant, so every call gets the same 'random' "
         "value, with no error",
         "use MindSpore's random ops inside the graph (ops.uniform, ops.standard_normal, ops.dropout, "
         "ops.randperm), or draw on the host and pass the value as a Tensor argument",
         "tools/doctor_evidence.py `np_random` and `py_random`: x + np.random.rand() and x + random.random() "
         "in a GRAPH_MODE construct returned the same value on 3 calls"),
]

RULES = {r.id: r for r in _RULES}
