"""`fuzz --database none` leaves nothing in the working directory (issue: Hypothesis still wrote its
.hypothesis/ folder there). In a fresh process, since Hypothesis writes its cache once per process."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import POLICIES, WORKLOADS


def test_fuzz_without_a_database_writes_no_hypothesis_folder(tmp_path):
    code = ("import sys; from checker.cli import main; sys.exit(main(sys.argv[1:]))")
    out = tmp_path / "cx"
    run = subprocess.run([sys.executable, "-c", code, "fuzz", str(POLICIES / "vllm_v1.yaml"), "--workload",
                          str(WORKLOADS / "chat_mixed.yaml"), "--max-examples", "3", "--database", "none",
                          "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (["cx"] if out.exists() else [])
