"""mkdocs hooks: the reference pages' tables, generated from the code at build time.

A page holds a marker line and the hook puts the generated Markdown in its place:
`<!-- generated: cli -->` (every command's `--help`, from `mindstep.cli.build_parser`),
`<!-- generated: config -->` (every `mindstep train` config key, from the pydantic models) and
`<!-- generated: doctor-rules -->` (the doctor's rule table).
"""
from __future__ import annotations

import argparse
import re

_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def on_page_markdown(markdown, page, config, files):
    return _MARKER.sub(lambda m: _GENERATORS[m.group(1)](), markdown)


def cli_markdown() -> str:
    import os

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the page must not depend on it
    from mindstep.cli import build_parser

    parser = build_parser()
    parser.prog = "mindstep"
    out = ["```text", parser.format_help().rstrip(), "```"]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        out += [f"\n## `mindstep {name}`\n", "```text", command.format_help().rstrip(), "```"]
    return "\n".join(out)


def config_markdown() -> str:
    from mindstep.train import config

    out = []
    top = config.Config
    for section, field in top.model_fields.items():
        model = field.annotation if isinstance(field.annotation, type) and issubclass(
            field.annotation, config.BaseModel) else None
        if model is None:
            continue
        out += [f"\n## `{section}:`\n", "| key | type | default | what |", "| --- | --- | --- | --- |"]
        for key, sub in model.model_fields.items():
            out.append(f"| `{section}.{key}` | {_type(sub.annotation)} | `{_default(sub)}` | "
                       f"{_constraints(sub)}{sub.description or ''} |")
    rows = [f"| `{k}` | {_type(f.annotation)} | `{_default(f)}` | {f.description or ''} |"
            for k, f in top.model_fields.items() if not (isinstance(f.annotation, type)
                                                          and issubclass(f.annotation, config.BaseModel))]
    return "\n".join(["## Top level\n", "| key | type | default | what |", "| --- | --- | --- | --- |", *rows, *out])


def doctor_markdown() -> str:
    from mindstep.doctor.rules import RULES

    out = []
    for rule in RULES.values():
        out += [f"\n### {rule.id} `{rule.name}` ({rule.severity})\n", f"**What goes wrong.** {_cap(rule.message)}.\n",
                f"**Fix.** {_cap(rule.fix)}."] + ([f"\n**Measured.** {_cap(rule.evidence)}."] if rule.evidence else [])
    return "\n".join(out)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return text.replace("|", "\\|")


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return repr(value)


def _constraints(field) -> str:
    bounds = []
    for item in field.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, name, None) is not None:
                bounds.append(f"{sign} {getattr(item, name)}")
    return f"{', '.join(bounds)}. " if bounds else ""


_GENERATORS = {"cli": cli_markdown, "config": config_markdown, "doctor-rules": doctor_markdown}
