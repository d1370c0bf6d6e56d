"""`mindstep env`: what a user checks first (the tutorial's `npu-smi info` step)."""
from __future__ import annotations

import contextlib
import io
import os
import platform

import numpy as np
import psutil

from . import _cpu


def _device_usable(target: str) -> tuple[bool, str]:
    """Whether MindSpore can use `target` here, without initialising the runtime."""
    import mindspore as ms

    if target == "CPU":
        return True, "always available"
    module = getattr(getattr(ms, "device_context", None), target.lower(), None)
    check = getattr(module, "is_available", None)
    if check is None:
        return False, f"mindspore.device_context.{target.lower()} is missing in this build"
    try:
        ok = bool(check())
    except Exception as err:  # a missing driver raises instead of returning False
        return False, f"{type(err).__name__}: {err}"
    return ok, "available" if ok else "not available in this MindSpore build or machine"


def _run_check() -> tuple[bool, str]:
    import mindspore as ms

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            ms.run_check()
    except Exception as err:
        return False, f"{type(err).__name__}: {err}"
    text = buf.getvalue()
    ok = "successfully" in text.lower()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return ok, lines[-1] if lines else "no output"


def report(run_check: bool = True, peak: bool = False) -> dict:
    """Collect the environment report as a JSON-ready dict; `peak` adds a measured GEMM ceiling."""
    import mindspore as ms

    devices = {}
    for target in ("Ascend", "GPU", "CPU"):
        ok, why = _device_usable(target)
        devices[target] = {"usable": ok, "detail": why}
    mem = psutil.virtual_memory()
    info = {
        "mindstep": _version(),
        "mindspore": ms.__version__,
        "numpy": np.__version__,
        "numpy_ok": int(np.__version__.split(".")[0]) < 2,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_target": ms.get_context("device_target"),
        "devices": devices,
        "cpu_cores": os.cpu_count(),
        "cpu": _cpu.describe(),
        "memory_gb": round(mem.total / 2**30, 1),
        "memory_available_gb": round(mem.available / 2**30, 1),
    }
    from .optimize.fusion import availability

    fusable, why = availability()
    info["graph_kernels"] = {"usable": fusable, "detail": why}
    if peak:
        from .bench.worker import PEAK_METHOD, measure_peak_gflops

        info["gemm_peak"] = {"gflops": round(measure_peak_gflops(), 1), "device": info["device_target"],
                             "method": PEAK_METHOD}
    if run_check:
        ok, detail = _run_check()
        info["run_check"] = {"passed": ok, "detail": detail}
    return info


def _version() -> str:
    from . import __version__

    return __version__


def render(info: dict) -> str:
    """Human-readable lines for `mindstep env`."""
    lines = [
        f"mindstep      {info['mindstep']}",
        f"MindSpore     {info['mindspore']}",
        f"numpy         {info['numpy']}" + ("" if info["numpy_ok"] else "  <- MindSpore 2.10 needs numpy<2: pip install 'numpy<2'"),
        f"Python        {info['python']} ({info['platform']})",
        f"device target {info['device_target']}",
    ]
    for target, d in info["devices"].items():
        lines.append(f"  {target:<7} {'yes' if d['usable'] else 'no ':<4} {d['detail']}")
    cpu = info["cpu"]
    lines.append(f"CPU           {cpu['model'] or 'unknown'} ({_cpu.identity(cpu)}{cpu['arch'] or 'unknown arch'})")
    lines.append(f"  SIMD        {', '.join(cpu['simd']) or 'none reported'}")
    lines.append(f"CPU cores     {info['cpu_cores']}")
    if "gemm_peak" in info:
        g = info["gemm_peak"]
        lines.append(f"GEMM peak     {g['gflops']} GFLOP/s fp32 on {g['device']} ({g['method']})")
    lines.append(f"memory        {info['memory_gb']} GiB ({info['memory_available_gb']} GiB available)")
    gk = info["graph_kernels"]
    lines.append(f"graph kernels {'yes' if gk['usable'] else 'no '}  {gk['detail']}")
    if "run_check" in info:
        rc = info["run_check"]
        lines.append(f"run_check     {'passed' if rc['passed'] else 'FAILED'}: {rc['detail']}")
    return "\n".join(lines)
