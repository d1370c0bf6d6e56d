"""The `mindstep` command line: thin parsing over the library (STYLE.md principle 8)."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_env(args) -> int:
    from . import env

    info = env.report(run_check=not args.no_run_check)
    print(json.dumps(info, indent=2) if args.json else env.render(info))
    return 0 if info.get("run_check", {}).get("passed", True) else 1


def _cmd_demo(args) -> int:
    from . import demo

    rows = demo.run(steps=args.steps, batch=args.batch_size, image=args.image_size)
    print(json.dumps(rows, indent=2) if args.json else demo.render(rows, args.steps, args.batch_size, args.image_size))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindstep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("env", help="MindSpore, devices, cores, memory, numpy, run_check")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-run-check", action="store_true", help="skip mindspore.run_check()")
    p.set_defaults(func=_cmd_env)

    p = sub.add_parser("demo", help="a short training run, PyNative vs the compiled step")
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--batch-size", type=_positive, default=32)
    p.add_argument("--image-size", type=_positive, default=16)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
