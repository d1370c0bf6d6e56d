"""One eager, inference-mode forward with hooks: how mindstep reads the shapes a network sees."""
from __future__ import annotations

from ._context import drain_pynative, pynative_mode, reset_pynative_grad, sync_pynative


def probe_forward(nets, hook_for, run) -> None:
    """Call `run()` once with forward hooks on the Cells of `nets`, and leave no trace.

    `hook_for(cell)` returns a hook `(cell, args, out) -> None` or None. The nets run in inference
    mode (`set_train(False)`) so BatchNorm statistics are not updated; afterwards every Cell's
    training flag is restored, the hooks are removed and PyNative's grad state is reset; an error of
    `run()` is raised by this call, never by a later one (PyNative's queue is synced). The call runs
    in PyNative whatever the caller's mode: under a global GRAPH_MODE, MindSpore 2.10 compiles
    `net(...)` whole and no forward hook fires (the probe would see no layer at all).
    """
    handles, flags = [], []
    for net in nets:
        for _, cell in net.cells_and_names():
            flags.append((cell, cell.training))
            hook = hook_for(cell)
            if hook is not None:
                handles.append(cell.register_forward_hook(hook))
    try:
        for net in nets:
            net.set_train(False)
        with pynative_mode():
            run()
            sync_pynative()  # a failed op raises here, in the call that made it (see `sync_pynative`)
    except BaseException:
        drain_pynative()
        raise
    finally:
        for handle in handles:
            handle.remove()
        for cell, training in flags:
            cell.training = training
        reset_pynative_grad()
