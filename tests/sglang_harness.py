"""SGLang 0.5.23's real scheduler as an oracle: find the venv tools/sglang_setup.sh builds, run
tests/sglang_driver.py in it, read the step logs it writes.

The driver runs inside the SGLang venv (it imports sglang, never batchcheck); this module runs in batchcheck's
own python and only starts it. One driver process serves any number of runs, since SGLang's import takes
20-30 s on two cores: ``drive`` imports the driver once and calls its ``run`` per job.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "sglang_driver.py"
SETUP = ROOT / "tools" / "sglang_setup.sh"
DEFAULT_VENV = Path.home() / ".cache" / "sglang-scheduler" / "venv"
VENV_ENV = "BATCHCHECK_SGLANG_VENV"


def venv_python() -> Path | None:
    """The SGLang venv's python, or None when the venv is absent (BATCHCHECK_SGLANG_VENV, else
    ~/.cache/sglang-scheduler/venv)."""
    venv = Path(os.environ.get(VENV_ENV) or DEFAULT_VENV).expanduser()
    python = venv / "bin" / "python"
    return python if python.exists() else None


def absent_reason() -> str:
    return (f"the SGLang scheduler venv is absent (build it with {SETUP.relative_to(ROOT)}, or point "
            f"{VENV_ENV} at one)")


_SCRIPT = """\
import json, sys
sys.path.insert(0, {folder!r})
import sglang_driver as d
sg = d.sglang()
summaries = []
for trace, flags, out in json.load(open(sys.argv[1])):
    args = d.parse_args([trace, *flags, "--out", out])
    with open(out, "w") as f:
        summaries.append(d.run(args, f, sg))
json.dump(summaries, open(sys.argv[2], "w"))
"""


def drive(jobs: list[tuple[Path, list[str], Path]], timeout: float = 1800) -> list[dict]:
    """Run the driver on each (trace, flags, log) in one process; return the driver's summary of each run
    (steps, requests, done, setup_s, loop_s, steps_per_s)."""
    python = venv_python()
    if python is None:
        raise RuntimeError(absent_reason())
    with tempfile.TemporaryDirectory() as tmp:
        spec, result = Path(tmp) / "jobs.json", Path(tmp) / "summaries.json"
        spec.write_text(json.dumps([[str(t), [str(x) for x in f], str(o)] for t, f, o in jobs]))
        script = _SCRIPT.format(folder=str(DRIVER.parent))
        proc = subprocess.run([str(python), "-c", script, str(spec), str(result)], capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the SGLang driver failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(result.read_text())


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows))
    return path


def read_log(path: Path) -> list[dict]:
    """The driver's step records, one dict per step, in step order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_one(folder: Path, name: str, rows: list[dict], flags: list[str]) -> tuple[list[dict], dict]:
    """Write one trace, drive it, return (step records, summary)."""
    trace = write_trace(folder / f"{name}.trace.json", rows)
    log = folder / f"{name}.log.jsonl"
    summary = drive([(trace, flags, log)])[0]
    return read_log(log), summary
