"""The README's example runs as written, as a script in a fresh interpreter."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README must show a Python example"
    example = blocks[0]
    assert len(example.strip().splitlines()) <= 20
    script = tmp_path / "example.py"
    # the example's BatchNorm layer must train in training mode: its running statistics move
    script.write_text(example + "\nprint('bn', float(abs(net[1].moving_mean.asnumpy()).sum()), net.training)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss, acc, steps, compiles = re.search(r"loss (\S+) acc (\S+) steps (\d+) compiles (\d+)", proc.stdout).groups()
    assert int(steps) == 50 and int(compiles) == 1
    assert float(loss) < 1.0 and 0.5 < float(acc) <= 1.0
    moved, training = re.search(r"bn (\S+) (\S+)", proc.stdout).groups()
    assert float(moved) > 0 and training == "True"
