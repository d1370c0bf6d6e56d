"""Run each tutorial of `tests/tutorials` as published and as ported to mindstep, as module-level
scripts (`runpy`, a fresh namespace each), and print one JSON line per tutorial comparing the two:
losses, final weights, whether every bit is equal. `test_tutorials.py` runs it in a fresh interpreter."""
import json
import os
import runpy
import sys

import numpy as np

NETWORKS = {"lenet_model": "network"}  # the global each script trains (default: `model`)


def run(name: str) -> dict:
    results = []
    for script in (f"{name}.py", f"{name}_port.py"):
        scope = runpy.run_path(script, run_name="__main__")
        net = scope[NETWORKS.get(name, "model")]
        results.append((scope["losses"], {p.name: p.asnumpy() for p in net.trainable_params()}))
    (losses, weights), (port_losses, port_weights) = results
    return {"tutorial": name, "steps": [len(losses), len(port_losses)],
            "loss_diff": float(np.max(np.abs(np.subtract(losses, port_losses)))) if len(losses) == len(port_losses)
            else None,
            "weight_diff": max(float(np.abs(weights[k] - port_weights[k]).max()) for k in weights),
            "same_names": sorted(weights) == sorted(port_weights),
            "bit_identical": losses == port_losses and all(np.array_equal(weights[k], port_weights[k]) for k in weights)}


if __name__ == "__main__":
    os.chdir(sys.argv[1])
    for tutorial in sys.argv[2:]:
        print(json.dumps(run(tutorial)), flush=True)
