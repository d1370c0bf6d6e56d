"""Host-side argument validation with errors that name the argument, the value, the choices and the fix.

Every public entry point validates its arguments here, before anything is compiled, so a bad
hyper-parameter fails in one readable line instead of deep inside MindSpore's graph compiler.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterable


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"


def bad_type(name: str, value: Any, expected: str, fix: str) -> TypeError:
    """Build a TypeError: `name` got `value`; it must be `expected`; `fix`."""
    return TypeError(f"`{name}` must be {expected}, but got {_show(value)}. {fix}")


def bad_value(name: str, value: Any, expected: str, fix: str) -> ValueError:
    """Build a ValueError: `name` got `value`; it must be `expected`; `fix`."""
    return ValueError(f"`{name}` must be {expected}, but got {_show(value)}. {fix}")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_type(name, value, "True or False", f"Pass `{name}=True` or `{name}=False`.")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str], fix: str = "") -> str:
    choices = tuple(choices)
    listed = ", ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise bad_type(name, value, f"one of {listed}", fix or f"Pick one of {listed}.")
    if value not in choices:
        raise bad_value(name, value, f"one of {listed}", fix or f"Pick one of {listed}.")
    return value


def check_int(name: str, value: Any, *, minimum: int, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise bad_type(name, value, f"an int >= {minimum}", fix or f"Pass a Python int, e.g. `{name}={max(minimum, 1)}`.")
    if value < minimum:
        raise bad_value(name, value, f"an int >= {minimum}", fix or f"Pass a Python int, e.g. `{name}={max(minimum, 1)}`.")
    return int(value)


def check_float(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, fix: str = "") -> float:
    """Check a finite real number in the interval described by low/high (open or closed ends)."""
    lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
    hi = "" if high is None else (f"< {high}" if high_open else f"<= {high}")
    expected = "a finite float" + (f" {lo}" if lo else "") + (" and" if lo and hi else "") + (f" {hi}" if hi else "")
    fix = fix or f"Pass a Python float, e.g. `{name}={_example(low, high)}`."
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad_type(name, value, expected, fix)
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise bad_value(name, value, expected, fix)
    if low is not None and (v < low or (low_open and v == low)):
        raise bad_value(name, value, expected, fix)
    if high is not None and (v > high or (high_open and v == high)):
        raise bad_value(name, value, expected, fix)
    return v


def _example(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return repr((low + high) / 2)
    if low is not None:
        return repr(float(low) + 1.0)
    return "1.0"
