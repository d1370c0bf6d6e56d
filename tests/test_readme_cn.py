"""README_CN.md is the README in Chinese: the same commands and code blocks, in the same order,
and the same sections, so that neither can drift from the other."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def test_the_chinese_readme_has_every_code_block_of_the_readme_in_order():
    en, cn = FENCE.findall(_read("README.md")), FENCE.findall(_read("README_CN.md"))
    assert len(en) == len(cn), f"README.md has {len(en)} code blocks, README_CN.md {len(cn)}"
    for i, (a, b) in enumerate(zip(en, cn)):
        assert a == b, f"code block {i + 1} differs:\n{a}\n---\n{b}"


def test_the_chinese_readme_has_the_same_sections_and_inline_commands():
    en, cn = _read("README.md"), _read("README_CN.md")
    assert len(re.findall(r"^## ", en, re.M)) == len(re.findall(r"^## ", cn, re.M))
    for command in sorted(set(re.findall(r"`(mindstep [a-z]+)", en)) | {"make test", "make bench"}):
        assert command in cn, command


def test_each_readme_links_to_the_other():
    assert "README_CN.md" in _read("README.md") and "README.md" in _read("README_CN.md")
