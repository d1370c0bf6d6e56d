"""`mindstep doctor --explain`: map a MindSpore traceback to a plain explanation and a fix.

Each entry is a pattern seen on MindSpore 2.10 (most measured on this project's
machines) with what it means and what to do. Unknown tracebacks get an honest "not known".
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    id: str
    pattern: str
    title: str
    explanation: str
    fix: str


KNOWN = [
    Known("bf16-cpu", r"Select CPU operator\[\w+\] fail! Unsupported data type",
          "No CPU kernel for this dtype",
          "The CPU backend has no bfloat16 kernels (MatMul, Conv2D, ReLU, Softmax and cross_entropy all fail).",
          "Use float32 (or float16, which runs but is slower) on CPU: precision='O0' or 'p=f32,c=f16,o=f32'; "
          "keep bf16 for Ascend/GPU."),
    Known("npu-float-status", r"NPUGetFloatStatus|NPUAllocFloatStatus|NPUClearFloatStatus",
          "NPU-only overflow detection on another device",
          "nn.TrainOneStepWithLossScaleCell (and older loss-scale code) reads the Ascend float-status "
          "registers, which do not exist on CPU/GPU.",
          "Check finiteness with mindspore.amp.all_finite: mindstep.TrainStep(loss_scale='dynamic') does."),
    Known("lambda", r"Parse Lambda Function Fail|unmatched '\]'",
          "A lambda in compiled code",
          "MindSpore's graph parser cannot compile lambda functions passed to jit/value_and_grad.",
          "Write the function with def."),
    Known("dtype-mismatch", r"input type must be same|should be same as '\w+'|must be the same type|"
          r"The type of input should be Tensor\[Float16\], but got Tensor\[Float32\]",
          "Operands with different dtypes",
          "An op such as MatMul or Conv2D got float16 and float32 inputs (typical with hand-made mixed "
          "precision: the input was cast but the weight or the other operand was not).",
          "Use one precision policy for the whole network (mindstep precision='O2') instead of manual casts, "
          "or cast both operands with ops.cast."),
    Known("type-join", r"Cannot join the return values of different branches|join.*(type|shape).*fail|"
          r"type of the (true|false) branch|failed to join",
          "The branches of an if/while disagree",
          "In graph mode both branches of a tensor condition must produce the same types and shapes "
          "(e.g. one returns a Tensor, the other a Python float or None).",
          "Give both branches the same kind of value: create tensors with the same dtype/shape before the if."),
    Known("scheduler-in-jit", r"Data type conversion is not supported for a 'Parameter'",
          "An LR scheduler stepped inside jit",
          "lr_scheduler.step() mutates Parameters with host-side float64 math that graph mode cannot compile.",
          "Call scheduler.step() on the host, or use mindstep.schedules (evaluated in the graph)."),
    Known("name-exists", r"its name '[^']+' already exists|name .* already exists",
          "Two Parameters with the same name in one graph",
          "A Parameter was named like optimizer state (accum.*, moment1.*, ...) or two Cells share names.",
          "Give your own Parameters a unique prefix (mindstep uses '<name>.')."),
    Known("strict-host", r"In JIT strict mode, cannot get attributes|inputs should be constant, but found variable",
          "Host-side code under fullgraph=True",
          "asnumpy()/numpy calls on tensors need the Python interpreter, which strict graph mode forbids.",
          "Use mindspore.ops inside the step and read values after the call; or drop fullgraph=True."),
    Known("kernel-unregistered", r"The kernel \w+ unregistered|Kernel select failed|unregistered",
          "Operator not available on this device",
          "This MindSpore build has no kernel for the op on this backend (mint.nn.Conv2d / mint.optim.AdamW "
          "on CPU, for instance).",
          "Use the nn/ops equivalent (nn.Conv2d, experimental.optim.AdamW) on CPU, or run on Ascend/GPU."),
    Known("model-amp-cpu", r"Only loss_scale_manager=None or FixedLossScaleManager",
          "Model(amp_level='O2') on CPU",
          "On CPU, Model only accepts no loss-scale manager or a fixed one without overflow dropping.",
          "Pass loss_scale_manager=FixedLossScaleManager(1024., drop_overflow_update=False), or use "
          "mindstep.TrainStep(precision='O2') which scales dynamically on every device."),
    Known("runtime-initialized", r"The runtime has been initialized",
          "Device chosen too late",
          "ms.set_device / set_context(device_target=...) must run before the first kernel.",
          "Call ms.set_device(...) right after importing mindspore."),
    Known("no-msrun", r"without using 'mpirun'|Maybe you are trying to call 'mindspore.communication.init\(\)'",
          "communication.init() outside a launcher",
          "init() needs the scheduler/worker environment that msrun (or the MS_ROLE variables) provides.",
          "Launch with msrun --worker_num=N --local_worker_num=N ... your_script.py."),
    Known("allreduce-max-cpu", r"AllReduce only support reduce sum on CPU",
          "Only SUM all-reduce on CPU", "The CPU collective backend implements ReduceOp.SUM only.",
          "All-reduce with SUM and divide by the group size."),
    Known("numpy2", r"compiled using NumPy 1\.x cannot be run in\s+NumPy 2|returned a result with an exception set",
          "numpy 2 with MindSpore 2.10",
          "MindSpore 2.10 imports under numpy 2 but its ops fail inside.",
          "pip install 'numpy<2'."),
    Known("dynamic-clone", r"The method 'Clone\(\)' doesn't implement",
          "jit(dynamic=1) failure", "jit(dynamic=1) crashes after a few distinct shapes in MindSpore 2.10.",
          "Pad/bucket to fixed shapes, or use Cell.set_inputs with None dims in GRAPH_MODE."),
    Known("unsupported-syntax", r"Unsupported syntax|is not supported in graph mode|not supported in 'construct'|"
          r"Using Python control flow in graph mode is not supported",
          "Python syntax graph mode cannot compile",
          "Graph mode compiles a subset of Python (no arbitrary generators, try/except inside jit, etc.). "
          "Note that if/while on tensors *are* supported in MindSpore 2.x.",
          "Move the construct out of the compiled function (do it on the host) or rewrite it with ops."),
]


def explain(text: str) -> list[dict]:
    """Every known pattern found in `text` (a traceback or log), most specific first."""
    out = []
    for k in KNOWN:
        match = re.search(k.pattern, text, flags=re.IGNORECASE)
        if match:
            out.append({"id": k.id, "title": k.title, "matched": match.group(0), "explanation": k.explanation,
                        "fix": k.fix})
    return out
