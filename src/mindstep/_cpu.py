"""The CPU this process runs on: model, architecture and SIMD flags (via py-cpuinfo).

Every figure mindstep prints depends on the CPU (MindSpore's native conv speed differed 25x between
two 2-core machines), so `mindstep env` and `mindstep bench` name it beside their figures. The x86
family and model numbers are part of the name: two machines reporting the same brand string and SIMD
flags ran a 2048^2 matmul 2.5x apart (docs/design/measurements.md).
"""
from __future__ import annotations

import functools
import os
import platform

# Flags that decide how fast MindSpore's CPU kernels run, in the order they are shown.
SIMD_ORDER = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
              "avx512vnni", "avx512_vnni", "avx512_bf16", "avx512bf16", "avx512_fp16", "amx_tile", "amx_bf16",
              "amx_int8", "asimd", "asimdhp", "asimddp", "sve", "sve2", "sme")


@functools.lru_cache(maxsize=1)
def describe() -> dict:
    """`{"model", "arch", "cores", "simd", "family", "model_number", "summary"}`; unknown parts are None
    or empty, never guessed."""
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception as err:  # an unknown platform: say so rather than fail the caller
        info = {"error": f"{type(err).__name__}: {err}"}
    model = info.get("brand_raw") or platform.processor() or None
    arch = info.get("arch_string_raw") or platform.machine() or None
    flags = {f.lower() for f in info.get("flags", [])}
    simd = [f for f in SIMD_ORDER if f in flags]
    out = {"model": model, "arch": arch, "cores": os.cpu_count(), "simd": simd,
           "family": info.get("family"), "model_number": info.get("model")}
    out["summary"] = summary(out)
    return out


def identity(cpu: dict) -> str:
    """`"family F model M, "` where the CPU reports both numbers, else empty."""
    if cpu.get("family") is None or cpu.get("model_number") is None:
        return ""
    return f"family {cpu['family']} model {cpu['model_number']}, "


def summary(cpu: dict) -> str:
    """One line: `<brand> (family F model M, x86_64, 2 cores; AVX2, AVX-512 F/DQ/CD/BW/VL)`; the
    family and model only where the CPU reports them."""
    simd = cpu.get("simd") or []
    parts = []
    if "avx2" in simd:
        parts.append("AVX2")
    elif "avx" in simd:
        parts.append("AVX")
    if "fma" in simd:
        parts.append("FMA")
    # py-cpuinfo may report one feature under two spellings (avx512vnni and avx512_vnni)
    avx512 = list(dict.fromkeys(f[6:].lstrip("_").upper() for f in simd if f.startswith("avx512")))
    if avx512:
        parts.append("AVX-512 " + "/".join(avx512))
    amx = [f[4:].upper() for f in simd if f.startswith("amx_")]
    if amx:
        parts.append("AMX " + "/".join(amx))
    parts += [f.upper() for f in simd if f.startswith(("asimd", "sve", "sme"))]
    machine = f"{identity(cpu)}{cpu.get('arch') or 'unknown arch'}, {cpu.get('cores') or '?'} cores"
    flags = "; " + ", ".join(parts) if parts else "; no AVX/AVX-512/AMX/NEON/SVE flags reported"
    return f"{cpu.get('model') or 'unknown CPU'} ({machine}{flags})"
