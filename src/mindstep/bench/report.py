"""Render a bench report: a rich table on the terminal, markdown, and a PNG bar chart."""
from __future__ import annotations

import math
import os

from rich.console import Console
from rich.table import Table

from .. import _cpu
from .runner import ratios

COLUMNS = ("mode", "samples/s", "vs pynative", "ms/step p50", "p90", "compile s", "peak MB", "MFU", "loss first",
           "loss last")


def _fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def rows(report: dict) -> list[list[str]]:
    rel = ratios(report)
    out = []
    for r in report["results"]:
        if r.get("status") == "failed":
            out.append([r["mode"], "FAILED", "-", "-", "-", "-", "-", "-", "-", r["error"][:60]])
            continue
        out.append([r["mode"], _fmt(r["throughput"], ".1f"), _fmt(rel.get(r["mode"]), ".2f") + "x" if r["mode"] in rel else "-",
                    _fmt(r["step_ms_p50"], ".1f") + (f" ±{50 * r['step_ms_spread']:.0f}%" if "step_ms_spread" in r else ""),
                    _fmt(r["step_ms_p90"], ".1f"), _fmt(r["compile_s"], ".2f"),
                    _fmt(r["peak_mem_mb"], ".0f"), _fmt(100 * r["mfu"], ".2f") + "%", _fmt(r["loss_first"], ".4f"),
                    _fmt(r["loss_last"], ".4f")])
    return out


def title(report: dict) -> str:
    c = report["config"]
    size = f"seq {c['seq_len']}" if c["model"] == "bert" else f"{c['image_size']}px"
    sources = sorted({r["mem_source"] for r in report["results"] if r.get("mem_source")})
    repeat = c.get("repeat", 1)
    runs = (f"; median of {repeat} interleaved runs per mode, ± half the range of their p50s" if repeat > 1 else "")
    limit = c.get("max_seconds")
    limit = f" (a run stops timing once they pass {limit:g} s)" if limit else ""
    return (f"{c['model']}, batch {c['batch_size']}, {size}, {c['steps']} timed steps{limit} after {c['warmup']} warm-up, "
            f"{report['device']}, MindSpore {report['mindspore']}, peak {report['peak_gflops']:.1f} GFLOP/s "
            f"(best 2048^2 fp32 matmul of {len(report.get('peak_runs_gflops', [])) or 1} runs); "
            f"memory = {', '.join(sources) or 'n/a'}{runs}\nCPU: {_cpu_line(report)}")


def _cpu_line(report: dict) -> str:
    cpu = report.get("cpu")
    return _cpu.summary(cpu) if cpu else "not recorded"


def print_table(report: dict, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 150))
    table = Table(title=title(report), title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "mode" else "right")
    for row in rows(report):
        table.add_row(*row)
    console.print(table)
    for r in report["results"]:
        if r.get("status") == "failed":
            console.print(f"[red]{r['mode']} failed:[/red] {r['error']}")
    for line in short_runs(report) + own_memory_lines(report) + ceiling_lines(report):
        console.print(line)


def short_runs(report: dict) -> list[str]:
    """A line for each mode whose runs timed fewer calls than --steps asked, or warmed up with fewer
    than --warmup (`--max-seconds`)."""
    lines = []
    for r in report["results"]:
        settings = r.get("settings") or {}
        if r.get("status") != "ok":
            continue
        for key, which in (("warmup_why", "warmed up least"), ("timed_calls_why", "timed fewest")):
            if key in settings:
                lines.append(f"{r['mode']}: {settings[key]}" + (f" (the run that {which})" if "runs" in r else ""))
    return lines


def own_memory_lines(report: dict) -> list[str]:
    """The anonymous memory each row's process held at the end (`anon_mem_mb`, Linux), where the
    peak column is the process's peak RSS: the same figures without MindSpore's library pages, whose
    resident share moves with the page cache between runs."""
    ok = [r for r in report["results"] if r.get("status") == "ok" and r.get("anon_mem_mb") is not None
          and r.get("mem_source") == "process peak RSS"]
    if not ok:
        return []
    return ["anonymous memory at the end of each run (the process's own, without library pages): "
            + ", ".join(f"{r['mode']} {r['anon_mem_mb']:.0f} MB" for r in ok)]


def ceiling_lines(report: dict) -> list[str]:
    """With `--ceiling`: the GEMM ceiling at the model's own shapes, and how near each row runs to it."""
    c = report.get("shape_ceiling")
    if not c:
        return []
    if "error" in c:
        return [f"GEMM ceiling at the model's shapes: failed: {c['error']}"]
    if not c["shapes"]:
        return ["GEMM ceiling at the model's shapes: the model has no Conv2d or Dense layer"]
    near = ", ".join(f"{r['mode']} {r['mfu'] / c['mfu']:.0%}" for r in report["results"]
                     if r.get("status") == "ok" and c["mfu"] == c["mfu"] and c["mfu"] > 0)
    return [f"GEMM ceiling at {report['config']['model']}'s own shapes: its Conv2d/Dense layers' forward and backward "
            f"GEMMs ({c['shapes']} shapes, {c['covered']:.0%} of the counted FLOPs) as bare MatMuls ran at "
            f"{c['gflops']:.1f} GFLOP/s = {_fmt(100 * c['mfu'], '.1f')}% of the peak"
            + (f"; each row's MFU as a share of it: {near}" if near else "")]


def markdown(report: dict) -> str:
    lines = ["# mindstep bench", "", title(report), "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    short = short_runs(report) + own_memory_lines(report) + ceiling_lines(report)
    if short:
        lines += [""] + [f"- {line}" for line in short]
    lines += ["", "Settings per mode:", ""]
    for r in report["results"]:
        settings = {k: v for k, v in (r.get("settings") or {}).items() if k != "optimize_report"}
        lines.append(f"- `{r['mode']}`: {settings or r.get('error')}")
        table = (r.get("settings") or {}).get("optimize_report")
        if table:
            from ..optimize import render

            lines += ["", "```", render(table), "```", ""]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out_dir: str) -> list[str]:
    """report.md and bench.png (throughput and peak memory per mode) under out_dir."""
    from .._extras import require

    require("bench", "mindstep bench's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    md = os.path.join(out_dir, "report.md")
    with open(md, "w") as f:
        f.write(markdown(report))
    ok = [r for r in report["results"] if r.get("status") == "ok"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["mode"] for r in ok]
    a.bar(names, [r["throughput"] for r in ok], color="tab:blue")
    a.set_ylabel("samples / s")
    a.set_title("throughput")
    b.bar(names, [r["peak_mem_mb"] for r in ok], color="tab:orange")
    b.set_ylabel("MB")
    b.set_title("peak memory (" + (ok[0]["mem_source"] if ok else "n/a") + ")")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title(report), fontsize=7)
    fig.tight_layout()
    png = os.path.join(out_dir, "bench.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return [md, png]
