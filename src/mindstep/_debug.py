"""`TrainStep(debug=True)`: a one-time, host-side report of every stage's shapes and dtypes.

The tutorial's advice is to sprinkle `ops.Print` through the graph; that prints on every call, from
C++, and changes the graph. Instead, before the first compiled call, mindstep runs the forward and
gradient stages once eagerly, reports what it saw, and restores every Parameter it touched (BatchNorm
statistics included), so the compiled step then starts from exactly the same state.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np

from ._context import pynative_mode, reset_pynative_grad
from ._graph import aux_items
from .groups import labelled_groups


def _describe(t) -> str:
    return f"{tuple(t.shape)} {t.dtype}"


def report(step, tensors) -> str:
    saved = [(p, p.asnumpy().copy()) for p in step._watch_all]
    try:
        with pynative_mode():  # an eager pass, whatever the caller's mode
            (scaled, (loss, weight, aux, parts)), grads = step.graph.grad_fn(*tensors)
        lines = [f"mindstep debug ({step.name}): one eager pass of the stages before compiling"]
        for i, t in enumerate(tensors):
            lines.append(f"  input batch[{i}]: {_describe(t)}")
        lines.append(f"  forward: loss {_describe(loss)} = {float(loss.asnumpy()):.6g}; weight {float(weight.asnumpy()):.6g}")
        values, names = aux_items(aux)
        for key, value in list(parts.items()) + list(zip(names, values)):
            lines.append(f"  aux {key}: {_describe(value)}")
        scale = step.graph.scale.value if hasattr(step.graph.scale, "value") else None
        lines.append(f"  loss scale: {float(scale.asnumpy()) if scale is not None else 'none'}"
                     f" (objective {float(scaled.asnumpy()):.6g})")
        by_name = {p.name: g for p, g in zip(step.optimizer.parameters, grads)}
        for label, names in labelled_groups(step.optimizer):
            sq = sum(float(np.sum(np.square(by_name[n].asnumpy().astype(np.float64)))) for n in names if n in by_name)
            dtypes = sorted({str(by_name[n].dtype) for n in names if n in by_name})
            lines.append(f"  grads {label}: {len(names)} tensors, {', '.join(dtypes)}, "
                         f"norm of the scaled gradient {np.sqrt(sq):.6g}")
        lines.append(f"  stages: accumulate k={getattr(step.graph.accumulate, 'k', 1)}, "
                     f"clip={step.graph.clip.norm_limit, step.graph.clip.value_limit}, "
                     f"ema={'on' if hasattr(step.graph.ema, 'shadow') else 'off'}, "
                     f"precision={step.precision.level} ({step.precision.policy}), compiler={step.compiler}")
        return "\n".join(lines)
    finally:
        for p, value in saved:
            p.set_data(ms.Tensor(value))
        reset_pynative_grad()
