"""The migration guide's examples run as written, each a script in a fresh namespace, in one fresh
interpreter; and the guide covers every idiom the step checks."""
import os
import re
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "migration" / "hand-written-loop.md"

_RUN = """
import runpy, sys
for path in sys.argv[1:]:
    print("=== " + path, flush=True)
    runpy.run_path(path, run_name="__main__")
"""


def test_every_example_runs_and_prints_what_it_says(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 3
    paths = []
    for i, block in enumerate(blocks):
        path = tmp_path / f"example_{i}.py"
        path.write_text(block)
        paths.append(str(path))
    runner = tmp_path / "run.py"
    runner.write_text(_RUN)
    proc = subprocess.run([sys.executable, str(runner), *paths], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"loss \S+ scale \S+ logits \(16, 10\)", out)
    assert "updates 2 applied on the last call True" in out
    assert len(re.findall(r"epoch \d loss \S+", out)) == 3


def test_the_guide_covers_every_idiom_the_step_checks():
    text = GUIDE.read_text()
    for words in ("loss_scaler.scale(loss)", "loss / accumulate_step", "auto_mixed_precision", "has_aux=True",
                  "aux1", "DynamicLossScaler(scale_value=2**16, scale_factor=2, scale_window=50)",
                  "num_epochs=E", "Model(net, loss_fn, optimizer).train", "PortingWarning", "float64"):
        assert words in text, words
