"""The doctor's rules: stable ids, severity, what goes wrong at run time, and the fix.

Each rule records a pitfall measured on MindSpore 2.10 or found
while building mindstep. `error`: the code runs but computes something else, or fails; `warning`:
it works but costs recompiles, host syncs or readability.
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
         "the value and store it on the host; mindstep.TrainStep keeps all step state in Parameters"),
    Rule("MS002", "stale-global", "error",
         "reads a module-level variable that is reassigned elsewhere; the compiled function baked in the value "
         "it saw at compile time and keeps using it, with no recompile and no warning",
         "pass the value as a Tensor argument, or keep it in a Parameter and update it with ops.assign"),
    Rule("MS003", "python-scalar-arg", "warning",
         "passes a Python number that changes every call to a jitted function; every new value is a new "
         "constant and recompiles the graph (about 1 s each)",
         "pass ms.Tensor(value) (or ms.mutable(value)) instead; mindstep.TrainStep converts scalars to tensors"),
    Rule("MS004", "lambda-in-jit", "error",
         "writes a lambda inside the call to jit/value_and_grad/grad of compiled code, or passes map/filter a "
         "lambda that reads a free variable; MindSpore 2.10 fails with 'Parse Lambda Function Fail ... make "
         "sure it is defined on a separate line' ('Map operator don't support Closure with free variable')",
         "define the function with def (def forward(x, y): return loss_fn(net(x), y)), or bind the lambda to a "
         "name on its own line first"),
    Rule("MS005", "load-after-jit", "error",
         "writes weights from the host (load_param_into_net / load_checkpoint / set_data) after a jitted function "
         "that uses them has run; a compiled ms.jit function keeps its own copy and silently ignores the new "
         "weights",
         "load before the first jitted call, or write with ops.assign(p, value); mindstep.TrainStep's default "
         "GRAPH_MODE cell sees host writes and its function compiler re-syncs them"),
    Rule("MS006", "trace-capture", "error",
         "compiles a training step with capture_mode='trace'; MindSpore 2.10 replays the traced graph without "
         "its side effects: it updates once, then returns a constant loss with no parameter updates",
         "use the default capture_mode ('ast') or mindstep.TrainStep"),
    Rule("MS007", "host-accumulation", "error",
         "accumulates gradients by rebinding a Python list or branches on a host integer (step % k) inside "
         "compiled code; the list does not persist between calls (nothing accumulates) and each new step value "
         "recompiles",
         "keep accumulators in Parameters with ops.assign_add and an int32 counter Parameter; or use "
         "mindstep.TrainStep(..., accumulate=k)"),
    Rule("MS008", "half-cast-label", "warning",
         "casts integer labels/masks/ids to float16 or bfloat16; class indices and masks must stay integers "
         "(fp16 cannot even represent every index above 2048)",
         "cast only floating inputs; mindstep's precision policies never cast integer inputs"),
    Rule("MS009", "state-name-collision", "error",
         "names a Parameter with a prefix that MindSpore optimizers use for their own state (accum., moment1., "
         "moments., global_step, ...); under jit this fails with \"its name '...' already exists\"",
         "use a unique prefix such as 'mystep.acc.' (mindstep uses '<name>.' for all its state)"),
    Rule("MS010", "host-sync-in-jit", "warning",
         "calls asnumpy()/item()/tolist() or numpy on tensors inside compiled code; this falls back to the "
         "Python interpreter, syncs with the host, and fails under fullgraph=True ('cannot get attributes "
         "asnumpy')",
         "use mindspore.ops for tensor math inside the step; read values on the host after the call"),
    Rule("MS011", "scheduler-step-in-jit", "error",
         "calls an LR scheduler's step() inside compiled code; MindSpore 2.10 fails ('Data type conversion is "
         "not supported for a Parameter ... Float64')",
         "call scheduler.step() on the host after the step, or use mindstep.schedules evaluated in the graph"),
    Rule("MS012", "allreduce-order", "error",
         "all-reduces after the optimizer update or without averaging; the ranks then apply different or "
         "world-size-times-too-large updates",
         "reduce gradients before the optimizer with nn.DistributedGradReducer (gradients_mean=True), or divide "
         "the all-reduced sum by the group size"),
    Rule("MS013", "print-in-jit", "warning",
         "print inside compiled code becomes a graph Print op that prints on every call to C-level stdout "
         "(not capturable with redirect_stdout)",
         "return the values as outputs (mindstep: aux metrics) or use TrainStep(debug=True)"),
    Rule("MS014", "dict-update-in-jit", "warning",
         "builds a dict with dict.update inside compiled code; measured on MindSpore 2.10, the updated entries "
         "were constant-folded and kept their first-call values",
         "build the dict with a literal ({'loss': loss, **aux} is also risky); return tuples and name them on "
         "the host"),
    Rule("MS015", "jit-takes-cells", "warning",
         "a jitted function takes the network/optimizer/loss as arguments; Cells as jit arguments are treated as "
         "constants and recompile when they change",
         "close over the network and optimizer instead of passing them (def train_step(x, y): ... opt(grads))"),
    Rule("MS016", "control-depend", "error",
         "calls ops.control_depend, which does not exist in MindSpore 2.x (AttributeError)",
         "order side effects with ops.depend(value, side_effect)"),
]

RULES = {r.id: r for r in _RULES}
