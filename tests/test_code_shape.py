"""The shape of the code a new reader meets: no function over 80 lines, and no check written twice
between the two steps (they share `mindstep._core`)."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "mindstep"
LIMIT = 80


def test_no_function_is_over_80_lines():
    long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LIMIT:
                long.append(f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_both_steps_take_their_shared_checks_from_the_core():
    """What both steps check or build (the function, name and precision checks, an update's settings
    and stages, the watched Parameters, save/load) is called from `_core` in each, not written in it."""
    for name in ("step.py", "gan.py"):
        text = (SRC / name).read_text(encoding="utf-8")
        for shared in ("_core.check_function", "_core.check_name", "_core.check_precision", "_core.watched",
                       "_core.StepMethods"):
            assert shared in text, f"{name} does not use {shared}"
        for own in ("<lambda>", "isidentifier", "_precision.check_device", "def save(", "def load(",
                    "def state_parameters(", "ScheduleStage("):
            assert own not in text, f"{name} writes {own!r} itself; it belongs in mindstep._core"
