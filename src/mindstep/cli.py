"""mindstep: your MindSpore training logic as one compiled, correct, measured training step.

MindSpore's own log lines are hidden unless you pass --verbose or set GLOG_v.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
import textwrap

from ._warmup import DEFAULT_WARMUP, KERNEL_SEARCH_CALLS

EXAMPLES = {
    None: """examples:
  mindstep env
  mindstep bench --model resnet18 --modes jit,jit-opt,model
  mindstep doctor train.py src/
  mindstep doctor --explain error.log
  mindstep demo --steps 20
  mindstep launch --nproc 2 -- python train.py""",
    "train": """examples:
  mindstep train --recipe resnet --json runs/resnet.json
  mindstep train --recipe resnet --print-config optim.lr=0.1 step.ema=0.999
  mindstep train --config my.yaml --out runs/my --resume
  mindstep train --recipe resnet --nproc 2""",
    "launch": """examples:
  mindstep launch --nproc 2 -- python train.py --lr 0.1
  mindstep launch --nproc 8 --log-dir runs/logs -- python -m mypkg.train
  # two nodes: the same line on each, with its own --node-rank
  mindstep launch --nproc 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 8118 -- python train.py""",
    "env": """examples:
  mindstep env                 # versions, devices, CPU, memory, mindspore.run_check()
  mindstep env --peak --json   # also a measured fp32 GEMM GFLOP/s, as JSON""",
    "bench": """examples:
  mindstep bench                                          # ResNet-18, the default modes
  mindstep bench --model bert --modes jit,model,onestep --steps 8 --repeat 3
  mindstep bench --model resnet50 --all-features --modes jit,jit-all --json out.json
  mindstep bench --modes jit,jit-opt --ceiling           # with the MFU the model's own GEMM shapes allow
  mindstep bench --model mlp --nproc 2 --steps 20       # data parallel: per-rank and total throughput
  mindstep bench --recipe resnet --stages               # the tutorial's stage table for a recipe""",
    "doctor": """examples:
  mindstep doctor train.py models/      # static check, nothing runs
  mindstep doctor src/ --ignore MS013   # skip a rule; `# noqa: MS013` silences one line
  python train.py 2> err.log; mindstep doctor --explain err.log""",
    "demo": """examples:
  mindstep demo
  mindstep demo --steps 50 --batch-size 64 --json""",
}


def _cmd_env(args) -> int:
    from . import env

    info = env.report(run_check=not args.no_run_check, peak=args.peak)
    print(json.dumps(info, indent=2) if args.json else env.render(info))
    return 0 if info.get("run_check", {}).get("passed", True) else 1


def _cmd_train(args) -> int:
    from .train import config, recipes

    try:
        if (args.recipe is None) == (args.config is None):
            raise config.ConfigError("give --recipe NAME or --config FILE.yaml (one of them); recipes: "
                                     + ", ".join(recipes.NAMES))
        user = config.load_yaml(args.config) if args.config else {}
        name = args.recipe or user.get("recipe")
        if not name:
            raise config.ConfigError(f"{args.config} has no `recipe:` key; add e.g. `recipe: {recipes.NAMES[0]}`")
        overrides = list(args.overrides)
        if args.steps is not None:
            overrides.append(f"train.steps={args.steps}")
        if args.data is not None:
            overrides.append(f"data.path={args.data}")
        cfg = config.resolve(recipes.defaults(name), user, overrides)
        if args.phase is not None:
            config.phase(cfg, args.phase)
        for each in [config.phase(cfg, p) for p in cfg.phases] or [cfg]:
            recipes.build(each)  # the recipe's own keys (model:) are checked before anything trains
    except config.ConfigError as err:
        print(f"mindstep train: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.dump(cfg), end="")
        return 0
    if args.max_restarts < 0 or args.restart_delay < 0:
        print("mindstep train: --max-restarts and --restart-delay must be >= 0", file=sys.stderr)
        return 2
    if args.nproc > 1 or args.max_restarts:
        from .dist.launch import Job
        from .dist.restart import one_process

        # every worker (or restarted process) trains the config resolved here, not its own re-parse
        os.makedirs(args.out, exist_ok=True)
        resolved = os.path.join(args.out, "launch.yaml")
        with open(resolved, "w") as fh:
            fh.write(config.dump(cfg))
        cmd = ["python", "-m", "mindstep", "train", "--config", resolved, "--out", args.out] + (
            ["--json", args.json] if args.json else []) + (["--resume"] if args.resume else []) + (
            ["--phase", args.phase] if args.phase else [])
        if args.nproc > 1:
            job = Job(cmd=cmd, nproc=args.nproc, log_dir=os.path.join(args.out, "logs"))
            return _launch_with_restarts(job, args.max_restarts, args.restart_delay, 30.0)
        return one_process(cmd[1:], args.max_restarts, args.restart_delay,
                           lambda text: print(f"mindstep train: {text}", file=sys.stderr, flush=True))
    from .dist import context
    from .train import loop

    context.init_distributed()
    out = args.out
    try:
        summary = loop.run(cfg, out, resume=args.resume, json_path=args.json, progress=sys.stderr.isatty(),
                           phase=args.phase)
    except (ValueError, config.ConfigError) as err:
        print(f"mindstep train: {err}", file=sys.stderr)
        return 2
    if context.is_main():
        for label, each in (summary.get("phases") or {"": summary}).items():
            ev = each["eval"]
            print(f"{cfg.recipe}{' ' + label if label else ''}: {each['steps']} batches, final loss "
                  f"{each['final_loss']:.4f}, {each['samples_per_s']:.1f} samples/s, data wait "
                  f"{each['data_wait_share']:.0%}; " + ", ".join(f"{k} {v:.4f}" for k, v in ev.items())
                  + f"; checkpoint {each['checkpoint']}")
            for note in each.get("notes", []):
                print(f"  note: {note}")
    return 0


def _cmd_launch(args) -> int:
    from .dist.launch import Job, Launch

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        job = Job(cmd=cmd, nproc=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                  master_addr=args.master_addr, master_port=args.master_port, log_dir=args.log_dir,
                  cluster_timeout_s=args.cluster_timeout)
    except ValueError as err:
        print(f"mindstep launch: {err}", file=sys.stderr)
        return 2
    if args.max_restarts < 0 or args.restart_delay < 0 or args.grace < 0:
        print("mindstep launch: --max-restarts, --restart-delay and --grace must be >= 0", file=sys.stderr)
        return 2
    return _launch_with_restarts(job, args.max_restarts, args.restart_delay, args.grace)


def _launch_with_restarts(job, max_restarts: int, delay_s: float, grace_s: float) -> int:
    """One `Launch` per attempt, restarted as `mindstep.dist.restart` decides."""
    from .dist.launch import Launch
    from .dist.restart import Ending, supervise

    def attempt(number, env):
        launch = Launch(job, env=env, grace_s=grace_s)
        code = launch.run()
        return launch.ending or Ending(code, None, f"exited with status {code}")

    say = lambda text: print(f"mindstep launch: {text}", file=sys.stderr, flush=True)  # noqa: E731
    return supervise(attempt, max_restarts, delay_s, say)


def _cmd_demo(args) -> int:
    from . import demo

    rows = demo.run(steps=args.steps, batch=args.batch_size, image=args.image_size)
    print(json.dumps(rows, indent=2) if args.json else demo.render(rows, args.steps, args.batch_size, args.image_size))
    return 0


def _cmd_bench_dp(args) -> int:
    """`bench --nproc N`: a single-process baseline, then N workers under `mindstep launch`."""
    from . import _cpu
    from .bench import dp

    flags = ["--model", args.model, "--image-size", str(args.image_size), "--seq-len", str(args.seq_len),
             "--steps", str(args.steps), "--warmup", str(args.warmup)] + (
        ["--batch-size", str(args.batch_size)] if args.batch_size else [])
    try:
        rows, baseline = dp.run_nproc(flags, args.nproc)
    except RuntimeError as err:
        print(f"mindstep bench: {err}", file=sys.stderr)
        return 1
    cpu = _cpu.describe()
    print(dp.report(args.model, rows, baseline, _cpu.summary(cpu)))
    if args.json:
        total = sum(r["samples_per_s"] for r in rows)
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "nproc": args.nproc, "cpu": cpu, "ranks": rows, "baseline": baseline,
                       "total_samples_per_s": total, "scaling": total / baseline["samples_per_s"]}, fh, indent=1)
    return 0


def _cmd_bench_stages(args) -> int:
    """`bench --recipe NAME --stages`: the tutorial's case-study table for a recipe."""
    from . import _cpu
    from .bench import stages
    from .train import config, recipes

    if args.recipe not in recipes.NAMES:
        print(f"mindstep bench: --recipe must be one of {', '.join(recipes.NAMES)}, got {args.recipe!r}", file=sys.stderr)
        return 2
    if not args.stages:
        print("mindstep bench: --recipe runs the staged report; add --stages", file=sys.stderr)
        return 2
    out = args.out or os.path.join("bench-out", f"stages-{args.recipe}")
    steps = args.stage_steps or recipes.STAGE_STEPS[args.recipe]
    try:  # the overrides are checked here, before six processes start
        config.resolve(recipes.defaults(args.recipe), None, args.set)
    except config.ConfigError as err:
        print(f"mindstep bench: {err}", file=sys.stderr)
        return 2
    rows = stages.run_all(args.recipe, steps, max(steps // 10, 1), out, user_overrides=args.set,
                          on_progress=lambda what, i, n: print(f"stage {i + 1}/{n}: {what}", file=sys.stderr, flush=True))
    cpu = _cpu.describe()
    print(stages.table(args.recipe, rows, _cpu.summary(cpu)))
    stages.plot(rows, os.path.join(out, "stages.png"), args.recipe)
    print(f"plot: {os.path.join(out, 'stages.png')}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"recipe": args.recipe, "steps": steps, "cpu": cpu, "stages": rows}, fh, indent=1)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _cmd_bench(args) -> int:
    if args.ceiling and (args.recipe is not None or args.stages or args.nproc > 1):
        print("mindstep bench: --ceiling got together with --stages/--recipe/--nproc; it times one model's "
              "shapes for the single-process table: drop one of them, e.g. mindstep bench --model resnet18 "
              "--ceiling", file=sys.stderr)
        return 2
    if args.recipe is not None or args.stages:
        return _cmd_bench_stages(args)
    if args.nproc > 1:
        return _cmd_bench_dp(args)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .bench import profile, report, runner

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    cfg = runner.BenchConfig(model=args.model, modes=modes, batch_size=args.batch_size, image_size=args.image_size,
                             seq_len=args.seq_len, steps=args.steps, warmup=args.warmup, repeat=args.repeat,
                             max_seconds=args.max_seconds,
                             distinct_batches=args.distinct_batches,
                             features=args.all_features, opt_memory_budget=args.opt_memory_budget,
                             accumulate=args.accumulate,
                             profile_dir=os.path.join(args.out or "bench-out", "profile") if args.profile else None,
                             ceiling=args.ceiling)
    try:
        cfg.validate()
    except (TypeError, ValueError) as err:
        print(f"mindstep bench: {err}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("bench", total=len(cfg.modes) + 1)

        def progress(what, done, total):
            bar.update(task, completed=done, description=f"{cfg.model}: {what}")

        result = runner.run(cfg, on_progress=progress)
    report.print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.out:
        for path in report.write_outputs(result, args.out):
            print(f"wrote {path}")
    for mode, key in (("jit-opt", "optimize_calibration"), ("jit-opt-fuse", "optimize_calibration_fuse")):
        cal = result.get(key)
        if not cal:
            continue
        tried = "; ".join(f"{'no cap' if t['memory_budget_mb'] is None else '%.0f MB' % t['memory_budget_mb']}: "
                          f"{'failed' if t['peak_mem_mb'] is None else '%.0f MB peak' % t['peak_mem_mb']}"
                          f"{' (within)' if t['within'] else ''}" for t in cal["trials"])
        chosen = cal["chosen"]
        print(f"{mode} memory calibration (peak <= {cal['peak_ratio']}x jit's {cal['native_peak_mb']:.0f} MB): "
              f"{tried} -> {'no cap' if chosen is None else chosen if chosen == 'default' else '%.0f MB' % chosen}")
    if args.explain:
        from .optimize import render

        for r in result["results"]:
            table = (r.get("settings") or {}).get("optimize_report")
            if table:
                st = r["settings"]
                budget = st.get("memory_budget_mb")
                shown = "no cap" if budget is None else f"{budget} MB, from {st.get('memory_budget_from')}"
                print(f"composed-operator pass, mode {r['mode']} ({st.get('optimize_s')} s, "
                      f"{st.get('rewritten')} rewritten; memory budget {shown}):")
                print(render(table))
    if cfg.profile_dir:
        for mode in cfg.modes:
            ops = profile.top_ops(os.path.join(cfg.profile_dir, mode))
            print(f"top ops, {mode} (profiled steps; times include profiler overhead):")
            for o in ops:
                print(f"  {o['op']:<28} {o['total_ms']:>10.1f} ms {o['percent']:>6.1f}%  {o['calls']} calls")
    return 1 if any(r.get("status") == "failed" for r in result["results"]) else 0


def _cmd_doctor(args) -> int:
    from . import doctor

    if args.explain is not None and re.fullmatch(r"(?i)MS\d{3}", args.explain) and not os.path.exists(args.explain):
        rule = doctor.RULES.get(args.explain.upper())
        if rule is None:
            print(f"mindstep doctor: no rule {args.explain}; rules: {', '.join(doctor.RULES)}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps({"rule": dataclasses.asdict(rule)}, indent=2))
        else:
            print(f"{rule.id} {rule.name} [{rule.severity}]\n  what goes wrong: {rule.message}\n  fix: {rule.fix}"
                  + (f"\n  measured: {rule.evidence}" if rule.evidence else ""))
        return 0
    if args.explain is not None:
        if args.explain == "-":
            text = sys.stdin.read()
        else:
            with open(args.explain, encoding="utf-8") as fh:
                text = fh.read()
        hits = doctor.explain(text)
        if args.json:
            print(json.dumps({"explanations": hits}, indent=2))
        elif not hits:
            print("mindstep doctor: no known MindSpore error in this text. Look for the first 'Error' line; "
                  "run the step with TrainStep(jit=False) to get a Python traceback at the failing line.")
        for h in hits if not args.json else []:
            print(f"[{h['id']}] {h['title']}\n  matched: {h['matched']}\n  why: {h['explanation']}\n  fix: {h['fix']}")
        return 0 if hits else 1
    if not args.paths:
        print("mindstep doctor: give files or folders to check, or --explain FILE (- for stdin)", file=sys.stderr)
        return 2
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"mindstep doctor: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        config_path = doctor.find_config(args.paths[0])
        config = doctor.load_config(config_path) if config_path else {}
        # the command line wins over [tool.mindstep.doctor], as with ruff
        select = doctor.rule_codes(args.select, "--select") if args.select is not None else config.get("select")
        ignore = doctor.rule_codes(args.ignore, "--ignore") if args.ignore is not None else config.get("ignore")
    except ValueError as err:
        print(f"mindstep doctor: {err}", file=sys.stderr)
        return 2
    stats = {}
    findings = doctor.select_rules(doctor.analyze_paths(args.paths, stats), select, ignore)
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps({"findings": findings}, indent=2))
    elif fmt == "sarif":
        from .doctor.sarif import to_sarif

        from . import __version__

        print(json.dumps(to_sarif(findings, __version__), indent=2))
    else:
        for f in findings:
            print(f"{doctor.location(f)}: {f['severity']} {f['rule']} "
                  f"{doctor.RULES[f['rule']].name}: {f['message']}\n    fix: {f['fix']}")
        errors = sum(f["severity"] == "error" for f in findings)
        unread = sum(f["rule"] == "MS000" for f in findings)
        print(f"{len(findings)} finding(s), {errors} error(s)" + (f", {unread} file(s) or notebook cell(s) not checked (MS000)" if unread
                                                                  else ""))
    if args.statistics:  # as ruff/flake8 --statistics: a count per rule, then what was read and how fast
        out = sys.stderr if fmt != "text" else sys.stdout
        counts = collections.Counter(f["rule"] for f in findings)
        for rule, n in sorted(counts.items()):
            print(f"{n:>6}  {rule}  {doctor.RULES[rule].name} [{doctor.RULES[rule].severity}]", file=out)
        seconds, slowest = stats["slowest"]
        print(f"{stats['files']} file(s) read in {stats['seconds']:.1f} s"
              + (f"; slowest {slowest} ({seconds:.2f} s)" if slowest else ""), file=out)
    return 1 if any(f["severity"] == "error" for f in findings) else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text}")
    return value


def _version() -> str:
    """`mindstep X (MindSpore Y, Python Z)`, without importing MindSpore."""
    import platform
    from importlib import metadata

    from . import __version__

    try:
        ms_version = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        ms_version = "not installed"
    return f"mindstep {__version__} (MindSpore {ms_version}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show MindSpore's own log lines (warnings and C++ call stacks)")
    parser = argparse.ArgumentParser(prog="mindstep", description=__doc__, epilog=EXAMPLES[None],
                                     formatter_class=fmt, parents=[common])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help_, description):
        return sub.add_parser(name, help=help_, description=textwrap.fill(description, 100), epilog=EXAMPLES[name],
                              formatter_class=fmt, parents=[common])

    for add_arguments in (_env_arguments, _bench_arguments, _doctor_arguments, _train_arguments, _launch_arguments, _demo_arguments):
        add_arguments(command)
    return parser


def _env_arguments(command) -> None:
    """`mindstep env`'s arguments."""
    p = command("env", "what this machine is: versions, devices, CPU, memory",
                "Print what MindSpore sees here: mindstep, MindSpore, numpy and Python versions; whether "
                "Ascend, GPU and CPU are usable; the CPU model and SIMD flags (every speed figure depends "
                "on them); cores and memory; and whether mindspore.run_check() passes.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-run-check", action="store_true", help="skip mindspore.run_check()")
    p.add_argument("--peak", action="store_true",
                   help="also measure an fp32 GEMM ceiling (GFLOP/s, best of 8 2048x2048 matmuls; a few seconds)")
    p.set_defaults(func=_cmd_env)


def _bench_arguments(command) -> None:
    """`mindstep bench`'s arguments."""
    p = command("bench", "PyNative vs jit vs jit-opt vs plain MindSpore, side by side",
                "Train a model for a few steps in each mode, each in a fresh process, and print throughput, "
                "step time (median and p90), compile time, peak memory and MFU against this run's measured "
                "GEMM peak, with the CPU named in the header.")
    p.add_argument("--model", default="resnet18", help="mlp, resnet18, resnet50, rrdbnet, bert (default resnet18)")
    p.add_argument("--modes", default="pynative,jit,jit-opt,seed,model",
                   help="comma-separated: pynative, jit, jit-all, jit-nocheck, jit-accum, jit-big, jit-opt, jit-opt-fuse, seed, model, onestep")
    p.add_argument("--batch-size", type=_positive, default=None, help="default: the model's own")
    p.add_argument("--image-size", type=_positive, default=32)
    p.add_argument("--seq-len", type=_positive, default=64)
    p.add_argument("--steps", type=_positive, default=5, help="timed steps per mode (median reported)")
    p.add_argument("--warmup", type=_positive, default=DEFAULT_WARMUP,
                   help=f"untimed steps first (default {DEFAULT_WARMUP}: the first one compiles, and MindSpore's "
                        f"CPU kernels run their first {KERNEL_SEARCH_CALLS} calls on one thread while they search "
                        "their thread count); warm-up ends early once the steps after the first add up to "
                        "--max-seconds")
    p.add_argument("--max-seconds", default=60.0, metavar="S|none",
                   help="a mode's timed steps stop once they add up to S seconds (default 60; at least one step, "
                        "or one accumulation window, is timed, and the output says when fewer than --steps "
                        "were; a step compiled apart whose first call took S is timed on that call alone); "
                        "'none' always times --steps")
    p.add_argument("--repeat", type=_positive, default=1,
                   help="run every mode R times, interleaved; report the median and spread of the runs (default 1)")
    p.add_argument("--distinct-batches", type=_positive, default=2,
                   help="distinct random batches, cycled (default 2); raise it (e.g. to --steps) to compare loss "
                        "trajectories without the network memorising the data")
    p.add_argument("--all-features", action="store_true",
                   help="mindstep modes with dynamic loss scale, accumulate=2, clip_grad_norm=1, ema=0.999")
    p.add_argument("--accumulate", type=_positive, default=4, metavar="K",
                   help="jit-accum's micro-batches per update (default 4); jit-big runs batches K times as large")
    p.add_argument("--opt-memory-budget", default="jit", metavar="jit|none|MB",
                   help="jit-opt's memory budget for composed layers: 'jit' (default: calibrated by measurement so "
                        "the peak stays within 1.25x the jit row's), 'none' (no cap: fastest), or a number of MB")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--out", metavar="DIR", help="write report.md and bench.png here")
    p.add_argument("--profile", action="store_true", help="profile the timed steps, print the top-10 ops")
    p.add_argument("--ceiling", action="store_true",
                   help="also time the model's Conv2d/Dense GEMMs at its own shapes as bare MatMuls: the MFU "
                        "an im2col + GEMM step could reach on this device, beside the 2048^2 peak")
    p.add_argument("--nproc", type=_positive, default=1,
                   help="data parallel: time the jit step on N workers (mindstep launch), per rank and in total, "
                        "against one process (--modes is not used then)")
    p.add_argument("--recipe", help="with --stages: a `mindstep train` recipe (resnet, bert)")
    p.add_argument("--stages", action="store_true",
                   help="the recipe's step through PyNative, jit, mixed precision, accumulation, composed "
                        "operators and recomputation, each in a fresh process")
    p.add_argument("--stage-steps", type=_positive, help="batches per stage (default: the recipe's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every stage, as in `mindstep train` (repeatable)")
    p.add_argument("--explain", action="store_true", help="print the composed-operator pass's per-layer decisions")
    p.set_defaults(func=_cmd_bench)


def _doctor_arguments(command) -> None:
    """`mindstep doctor`'s arguments."""
    p = command("doctor", "find graph-mode pitfalls in training code; --explain a MindSpore error",
                "Read Python files (nothing runs) and report the graph-mode pitfalls found, each with its "
                "line and a fix; or explain a MindSpore error message read from a file or stdin.")
    p.add_argument("paths", nargs="*", help="Python files or folders to check")
    p.add_argument("--explain", metavar="FILE|RULE", help="explain a MindSpore traceback read from FILE (- for "
                   "stdin), or a rule (--explain MS017: what goes wrong, the fix, and the measurement behind it)")
    p.add_argument("--select", metavar="CODES", help="only these rules: codes or prefixes, e.g. MS001,MS01")
    p.add_argument("--ignore", metavar="CODES", help="skip these rules: codes or prefixes, e.g. MS013")
    p.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                   help="text (default), json, or sarif (SARIF 2.1.0, for code scanning in CI)")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--statistics", action="store_true",
                   help="also print a count per rule, the files read and the slowest file")
    p.set_defaults(func=_cmd_doctor)


def _train_arguments(command) -> None:
    """`mindstep train`'s arguments."""
    p = command("train", "train a recipe or a YAML config end to end",
                "Train a recipe (its YAML defaults, your --config file, then key=value overrides, validated "
                "before anything is built) with mindstep's compiled step: a progress bar, metrics.jsonl, "
                "evaluation every train.eval_every batches, checkpoints every train.save_every, --resume from "
                "the newest complete checkpoint at the right batch, curves.png and a --json summary.")
    p.add_argument("--recipe", help="a packaged recipe: resnet, bert, esrgan")
    p.add_argument("--config", metavar="FILE", help="a YAML config (its `recipe:` names the recipe)")
    p.add_argument("--steps", type=_positive, help="the same as train.steps=N")
    p.add_argument("--data", metavar="PATH", help="your data instead of the recipe's default (data.path=PATH)")
    p.add_argument("--out", default="runs/train", help="the run's folder (default runs/train)")
    p.add_argument("--json", metavar="PATH", help="write the summary here")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    p.add_argument("--nproc", type=_positive, default=1, help="data-parallel workers (mindstep launch)")
    p.add_argument("--phase", help="run only this phase of a config with phases: (esrgan: pretrain, gan)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and stop")
    _restart_arguments(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. optim.lr=3e-4 step.accumulate=4")
    p.set_defaults(func=_cmd_train)


def _restart_arguments(p) -> None:
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="start the job again, resuming, when a worker dies or stops on SIGTERM, up to N times (default 0)")
    p.add_argument("--restart-delay", type=float, default=1.0, metavar="S", help="seconds before a restart (default 1)")


def _launch_arguments(command) -> None:
    """`mindstep launch`'s arguments."""
    p = command("launch", "run a data-parallel job on MindSpore's msrun; fail fast when a worker dies",
                "Start --nproc workers of this node through MindSpore's msrun, each running the Python command "
                "after --; print every worker's output with its rank; and when a worker fails (an exception, a "
                "non-zero exit, a signal), stop the whole job at once and exit non-zero, naming the rank and its "
                "last log lines. In the script, call mindstep.init_distributed() before building the step.")
    p.add_argument("--nproc", type=_positive, required=True, help="workers on this node (one per device)")
    p.add_argument("--nnodes", type=_positive, default=1, help="nodes in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes-1 (default 0)")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, help="port on node 0 (default: a free one; needed with --nnodes > 1)")
    p.add_argument("--log-dir", default="launch_logs", help="worker logs go here (default launch_logs)")
    p.add_argument("--cluster-timeout", type=_positive, default=60,
                   help="seconds to wait for every worker to join (default 60)")
    _restart_arguments(p)
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds the workers get to save after the launcher passes them SIGTERM/SIGINT (default 30)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the Python command each worker runs")
    p.set_defaults(func=_cmd_launch)


def _demo_arguments(command) -> None:
    """`mindstep demo`'s arguments."""
    p = command("demo", "a short training run, PyNative vs the compiled step",
                "Train a small conv net for a few steps eagerly (PyNative) and as one compiled mindstep step, "
                "and print both runs' losses, step times and compile counts.")
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--batch-size", type=_positive, default=32)
    p.add_argument("--image-size", type=_positive, default=16)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_demo)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):
        _verbose()
    from ._extras import MissingExtraError

    try:
        return args.func(args)
    except MissingExtraError as err:  # a feature whose optional packages are not installed
        print(f"mindstep: {err}", file=sys.stderr)
        return 2


def _verbose() -> None:
    """MindSpore's default log level (warnings), unless the user set GLOG_v or MindSpore is loaded."""
    import mindstep

    if not mindstep._USER_GLOG and "mindspore" not in sys.modules:
        os.environ["GLOG_v"] = "2"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
