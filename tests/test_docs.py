"""The docs as users meet them: every Python block runs, the site builds strictly, the API reference
names every public name, the Chinese pages match the English ones, the README stays short, the
docstring examples run, and nothing a user reads carries internal references."""
import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mindstep

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(Path(__file__).parent))
import doc_blocks  # noqa: E402

# pages whose blocks another test runs, with checks of its own output
RUN_ELSEWHERE = {"README.md": "test_readme.py", "docs/migration/hand-written-loop.md": "test_migration_guide.py"}
ENV = dict(os.environ, GLOG_v="3")


def english_pages():
    return sorted(p for p in DOCS.rglob("*.md") if not p.name.endswith(".zh.md"))


def _rel(path):
    return path.relative_to(ROOT).as_posix()


@pytest.mark.slow
@pytest.mark.xdist_group("docs")
def test_every_python_block_of_the_docs_runs(tmp_path):
    pages = [_rel(p) for p in english_pages() if doc_blocks.runnable(p.read_text(encoding="utf-8"))
             and _rel(p) not in RUN_ELSEWHERE]
    assert len(pages) >= 15, pages
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "doc_blocks.py"), str(tmp_path), *pages],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("=== ok") == len(pages), proc.stdout[-2000:]


def test_blocks_not_run_say_why():
    for page in [*english_pages(), ROOT / "README.md"]:
        for block in doc_blocks.blocks(page.read_text(encoding="utf-8")):
            first = block.lstrip().splitlines()[0]
            if first.startswith(doc_blocks.NEEDS):
                assert len(first) > len(doc_blocks.NEEDS) + 10, f"{page}: a `# needs:` marker without a reason"


@pytest.mark.xdist_group("docs")
def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stderr[-5000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "TrainStep" in api and "from_net" in api and "GANStep" in api
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "mindstep doctor" in cli and "--opt-memory-budget" in cli
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "step.accumulate" in config and "train.eval_every" in config
    rules = (tmp_path / "site" / "reference" / "doctor-rules" / "index.html").read_text(encoding="utf-8")
    assert all(code in rules for code in mindstep.doctor.RULES)
    assert (tmp_path / "site" / "zh" / "get-started" / "quickstart" / "index.html").exists()


def test_the_api_reference_names_every_public_name():
    text = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: mindstep\.(\w+)", text, re.M))
    missing = set(mindstep.__all__) - {"__version__"} - documented
    assert not missing, f"add `::: mindstep.NAME` to docs/reference/api.md for {sorted(missing)}"


def test_public_names_are_visible_to_static_tools():
    """The lazy exports are imported under TYPE_CHECKING too, so type checkers and API-doc generators
    resolve them: the same names as __all__, from the modules the lazy table names."""
    tree = ast.parse((ROOT / "src" / "mindstep" / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "_TYPE_CHECKING")
    seen = {}
    for node in block.body:
        for alias in node.names:
            seen[alias.asname or alias.name] = node.module
    assert set(seen) == set(mindstep.__all__) - {"__version__"}
    for name, module in seen.items():  # each static import names the object the lazy export gives
        expected = importlib.import_module(f"mindstep.{module}" if module else f"mindstep.{name}")
        assert getattr(mindstep, name) is (getattr(expected, name) if module else expected), name


def test_chinese_pages_have_the_english_pages_code_in_order():
    pairs = [(p, p.with_name(p.name[:-3] + ".zh.md")) for p in english_pages()]
    translated = [(en, zh) for en, zh in pairs if zh.exists()]
    assert len(translated) >= 20, "the Chinese site needs the user-facing pages"
    fence = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    for en, zh in translated:
        a, b = fence.findall(en.read_text(encoding="utf-8")), fence.findall(zh.read_text(encoding="utf-8"))
        assert a == b, f"{_rel(zh)}: its code blocks differ from {_rel(en)}'s"
    # every page a user follows to learn and use mindstep has its Chinese page
    for en, zh in pairs:
        if not _rel(en).startswith(("docs/design/", "docs/benchmarks")):
            assert zh.exists(), f"{_rel(en)} has no Chinese page {_rel(zh)}"


def test_the_readmes_are_short():
    for name in ("README.md", "README_CN.md"):
        lines = (ROOT / name).read_text(encoding="utf-8").count("\n")
        assert lines <= 150, f"{name} has {lines} lines; the details belong in docs/"


@pytest.mark.xdist_group("docs")
def test_docstring_examples_run():
    modules = sorted(_rel(p) for p in (ROOT / "src" / "mindstep").rglob("*.py")
                     if re.search(r"^\s*>>> ", p.read_text(encoding="utf-8"), re.M))
    assert modules, "no docstring examples found"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--doctest-modules", *modules], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=ENV)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"{len(modules)} passed" in proc.stdout or "passed" in proc.stdout


INTERNAL = re.compile(r"\bissue #?\d+|\bissues? \d+/\d+|shared notes|field notes|STYLE\.md|\bthis session\b|"
                      r"\bearlier session\b|\bour (?:machines|sessions)\b", re.I)


def test_nothing_a_user_reads_carries_internal_references():
    files = [ROOT / "README.md", ROOT / "README_CN.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md"),
             *(ROOT / "src" / "mindstep").rglob("*.py"), *(ROOT / "src" / "mindstep").rglob("*.yaml")]
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if INTERNAL.search(line):
                hits.append(f"{_rel(path)}:{n}: {line.strip()[:100]}")
    assert not hits, "internal references a user cannot follow:\n" + "\n".join(hits)


def test_the_internal_reference_check_sees_them():
    for text in ("see issue 15", "(shared notes)", "STYLE.md principle 1", "issue 15/19"):
        assert INTERNAL.search(text), text
    for text in ("an issue of shapes", "GitHub issues", "a session of training"):
        assert not INTERNAL.search(text), text


MEASUREMENT = re.compile(r"family \d+ model|\bXeon\b|\bEPYC\b|\bZen ?\d|\b20\d\d-\d\d-\d\d\b")


def test_measurements_live_in_the_docs_not_in_code_comments():
    """Code keeps a reason in one line and a pointer; the figures (with their CPU and date) live in
    docs/design/measurements.md and the other design pages."""
    hits = [f"{_rel(p)}:{n}: {line.strip()[:90]}" for p in (ROOT / "src" / "mindstep").rglob("*")
            if p.suffix in (".py", ".yaml") for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if MEASUREMENT.search(line)]
    assert not hits, "move these measurements to docs/design/measurements.md:\n" + "\n".join(hits)
    assert MEASUREMENT.search("an Intel Xeon family 6 model 167, 2026-12-06")
