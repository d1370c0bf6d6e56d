"""No MindSpore warning from compiling any step configuration: a user who imports MindSpore before
mindstep (every tutorial does) sees MindSpore's warnings, so the step must make none of its own."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("quiet_cases.py")


@pytest.mark.slow
def test_every_configuration_compiles_without_a_mindspore_warning(tmp_path):
    env = dict(os.environ, GLOG_v="2", PYTHONPATH=str(CASES.parent))
    proc = subprocess.run([sys.executable, str(CASES)], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"cases (\d+)", proc.stdout)
    found, case = {}, None
    for line in proc.stderr.splitlines():
        if line.startswith("=== "):
            case = None if line == "=== end" else line[4:]
            if case is not None:
                found[case] = []
        elif case is not None and re.match(r"\[(WARNING|ERROR)\]", line):
            found[case].append(line[:300])
    assert len(found) == int(re.search(r"cases (\d+)", proc.stdout).group(1))
    noisy = {case: lines for case, lines in found.items() if lines}
    assert not noisy, "\n".join(f"{case}: {lines}" for case, lines in noisy.items())


def test_the_check_sees_warnings(tmp_path):
    """The negative control: a MindSpore warning between the markers is found (a deprecated API)."""
    script = tmp_path / "noisy.py"
    script.write_text("import sys\nimport mindspore as ms\nsys.stderr.write('=== noisy\\n'); sys.stderr.flush()\n"
                      "ms.dtype_to_nptype(ms.float32)\nsys.stderr.write('=== end\\n')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOG_v="2"))
    block = proc.stderr.split("=== noisy\n", 1)[1].split("=== end", 1)[0]
    assert re.search(r"^\[WARNING\]", block, flags=re.M)
