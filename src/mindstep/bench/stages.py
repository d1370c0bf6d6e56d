"""`mindstep bench --recipe NAME --stages`: the tutorial's case-study table for a recipe on this device.

The recipe's real step is taken through the stages, each adding to the one before, each in a fresh
process from the same weights and data: PyNative baseline -> jit -> + mixed precision (O2 with a
dynamic loss scale) -> + gradient accumulation (2 micro-batches of half the batch: the same samples
per update) -> + composed operators -> + recomputation. Every stage reports samples/s, ms/step
(median of the timed batches), peak memory (the process's max RSS), compile s (the first call),
and the training seconds to reach the recipe's quality target (evaluation time excluded), with
ratios to the baseline. A stage that is slower here is printed as slower, with the reason where one
is known (fp16 on CPU); a stage that fails is printed with its error; none is hidden or dropped.

    python -m mindstep.bench.stages --recipe resnet --stage 2 --steps 60 --json row.json   # one stage
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

STAGES = (
    ("pynative", "PyNative baseline"),
    ("jit", "+ jit (GRAPH_MODE Cell)"),
    ("amp", "+ mixed precision (O2, dynamic loss scale)"),
    ("accumulate", "+ gradient accumulation (2 x half batch)"),
    ("composed", "+ composed operators"),
    ("recompute", "+ recomputation"),
)
# a recipe's published figures, printed under its table for reference (another device, another model size)
REFERENCE = {"esrgan": "the tutorial's own ESRGAN case study (Ascend NPU, full-size ESRGAN; its section 8): baseline "
                       "PyNative 1.2 it/s, 10.4 GB, 48 h to converge -> after jit, mixed precision, accumulation and "
                       "operator fusion 1.8 it/s (1.50x), 7.1 GB (0.68x), 32 h (0.67x)"}
# why a stage is expected to be slower on a device, printed beside it when it is
SLOWER = {("amp", "CPU"): "fp16 kernels are slower than fp32 on CPU (MindSpore 2.10)",
          ("recompute", "CPU"): "recomputation trades time for memory: the forward runs twice"}


def overrides(stage: int, cfg) -> list:
    """The config overrides of stage `stage` (cumulative: each stage keeps the ones before)."""
    out = ["step.jit=false"] if stage == 0 else []
    if stage >= 2:
        out += ["step.precision=O2", "step.loss_scale=dynamic"]
    if stage >= 3:
        out += ["step.accumulate=2", f"data.batch_size={max(cfg.data.batch_size // 2, 1)}"]
    # the pass is a stage of its own: off before it even where the recipe turns it on (esrgan)
    out += ["step.optimize=true"] if stage >= 4 else ["step.optimize=false"]
    if stage >= 5:
        out += [f"step.recompute={json.dumps(cfg_recompute(cfg))}"]
    return out


def cfg_recompute(cfg) -> list:
    from ..train import recipes

    return recipes.RECOMPUTE[cfg.recipe]


def run_stage(recipe_name: str, stage: int, steps: int, eval_every: int, workdir: str, user_overrides=()) -> dict:
    """Train one stage for `steps` batches in this process; the row of the table."""
    import mindspore as ms

    from ..train import config, recipes
    from ..train.loop import Batches, build_step

    base = config.resolve(recipes.defaults(recipe_name), None, user_overrides)
    cfg = config.resolve(recipes.defaults(recipe_name), None, list(user_overrides) + overrides(stage, base)
                         + [f"train.steps={steps}"])
    recipe = recipes.build(cfg, workdir)
    metric, target = recipes.TARGETS[recipe_name]
    net, step, _ = build_step(cfg, recipe)
    data = Batches.of(cfg, recipe).from_batch(0)
    times, train_s, reached, last_eval = [], 0.0, None, None
    for i in range(steps):
        batch = next(data)
        t0 = time.perf_counter()
        float(step(*batch)["loss"])
        dt = time.perf_counter() - t0
        times.append(dt)
        train_s += dt
        if reached is None and (i + 1) % eval_every == 0:
            last_eval = recipe.evaluate()[metric]
            if last_eval >= target:
                reached = train_s
    timed = times[max(cfg.step.accumulate, 1):] or times  # the first call(s) compile
    ms_step = statistics.median(timed) * 1e3
    # a step is one micro-batch: samples per second counts what the step consumed
    return {"stage": STAGES[stage][0], "label": STAGES[stage][1], "overrides": overrides(stage, base),
            "device": ms.get_context("device_target"), "samples_per_s": cfg.data.batch_size / ms_step * 1e3,
            "ms_per_step": ms_step, "compile_s": times[0], "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "time_to_target_s": reached, "target": f"{metric} >= {target}", "last_eval": last_eval,
            "batch_size": cfg.data.batch_size, "accumulate": cfg.step.accumulate, "status": "ok"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one stage of `mindstep bench --recipe NAME --stages`")
    p.add_argument("--recipe", required=True)
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--workdir", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    try:
        row = run_stage(args.recipe, args.stage, args.steps, args.eval_every, args.workdir, args.overrides)
    except Exception as err:  # noqa: BLE001 - a failed stage is a row of the table, with its reason
        row = {"stage": STAGES[args.stage][0], "label": STAGES[args.stage][1], "status": "failed",
               "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
    with open(args.json, "w") as fh:
        json.dump(row, fh, indent=1)
    return 0 if row["status"] == "ok" else 1


def run_all(recipe_name: str, steps: int, eval_every: int, out_dir: str, user_overrides=(), on_progress=None) -> list:
    """Every stage in a fresh process, in order; the rows."""
    import subprocess

    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i in range(len(STAGES)):
        if on_progress:
            on_progress(STAGES[i][1], i, len(STAGES))
        path = os.path.join(out_dir, f"stage{i}.json")
        subprocess.run([sys.executable, "-m", "mindstep.bench.stages", "--recipe", recipe_name, "--stage", str(i),
                        "--steps", str(steps), "--eval-every", str(eval_every), "--workdir", out_dir,
                        "--json", path, *user_overrides], stdout=subprocess.DEVNULL)
        try:
            with open(path) as fh:
                rows.append(json.load(fh))
        except (OSError, ValueError):
            rows.append({"stage": STAGES[i][0], "label": STAGES[i][1], "status": "failed",
                         "error": "the stage's process ended without a result (killed?)"})
    return rows


def table(recipe_name: str, rows: list, cpu: str) -> str:
    """The case-study table, with ratios to the baseline (the first stage that ran)."""
    base = next((r for r in rows if r["status"] == "ok"), None)
    lines = [f"{recipe_name}: stages on {rows[0].get('device', base['device'] if base else '?')} ({cpu}); "
             f"target {base['target'] if base else '-'}",
             f"{'stage':<44}{'samples/s':>10}{'x base':>8}{'ms/step':>9}{'peak MB':>9}{'x base':>8}"
             f"{'compile s':>10}{'to target s':>12}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['label']:<44}  failed: {r['error']}")
            continue
        reach = f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None else "not reached"
        line = (f"{r['label']:<44}{r['samples_per_s']:>10.1f}{r['samples_per_s'] / base['samples_per_s']:>8.2f}"
                f"{r['ms_per_step']:>9.1f}{r['peak_mb']:>9.0f}{r['peak_mb'] / base['peak_mb']:>8.2f}"
                f"{r['compile_s']:>10.1f}{reach:>12}")
        prev = rows[rows.index(r) - 1] if rows.index(r) > 0 else None
        why = SLOWER.get((r["stage"], r["device"]))
        if prev and prev["status"] == "ok" and r["samples_per_s"] < prev["samples_per_s"] and why:
            line += f"  (slower: {why})"
        lines.append(line)
    if recipe_name in REFERENCE:
        lines.append(f"reference: {REFERENCE[recipe_name]}")
    return "\n".join(lines)


def plot(rows: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [r["stage"] for r in ok]
    ax[0].bar(labels, [r["samples_per_s"] for r in ok])
    ax[0].set(ylabel="samples/s", title=f"{title}: throughput")
    ax[1].bar(labels, [r["peak_mb"] for r in ok], color="tab:orange")
    ax[1].set(ylabel="peak RSS (MB)", title="peak memory")
    for a in ax:
        a.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
