"""Conformance of the engine with the real vLLM 0.33 scheduler under a KV connector, on generated traces.

Each case: a trace shape of tests/vllm_connector_harness.py (seeded), driven through the real scheduler with the
fake connector (tests/vllm_connector_driver.py), the policy imported with the same flags (`batchcheck import vllm
... --kv-transfer-config ...`), and the engine compared with the log step by step (check-log --conformance).
Prints the agreement table in markdown (docs/check-log.md carries it).

    python bench/vllm_connector_matrix.py [--keep DIR]

Needs the vLLM venv (BATCHCHECK_VLLM_VENV, default ~/.cache/vllm-scheduler/venv); exits 0 with a message when
it is absent.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.conformance_table import AgreementTable, first, share  # noqa: E402
from tests.connector_logs import compare  # noqa: E402
from tests.vllm_connector_harness import (abort_during_load, flags, grammars_and_failed_loads, hung_load,  # noqa: E402
                                          loads_with_latencies, pressure_with_loads, producer_sends, run_jobs,
                                          venv_python)


def cases() -> dict:
    out = {f"latencies_s{seed}": loads_with_latencies(n=120, seed=seed) for seed in range(2)}
    out.update({f"pressure_s{seed}": pressure_with_loads(n=200, num_blocks=80, seed=seed) for seed in range(3)})
    rows, _ = pressure_with_loads(n=200, num_blocks=80, seed=7)
    out["pressure_priority"] = ([{**r, "priority": i % 3} for i, r in enumerate(rows)],
                                flags("--policy", "priority", num_blocks=80, max_num_seqs=6, max_num_batched_tokens=192))
    rows, _ = pressure_with_loads(n=200, num_blocks=80, seed=8)
    out["pressure_aborts_caching"] = ([{**r, **({"abort_step": r["arrival_step"] + i % 9} if i % 5 == 0 else {}),
                                        **({"prefix_group": i % 4} if i % 2 else {})} for i, r in enumerate(rows)],
                                      flags("--enable-prefix-caching", num_blocks=80, max_num_seqs=6,
                                            max_num_batched_tokens=192))
    rows, _ = pressure_with_loads(n=200, num_blocks=80, seed=9)
    out["both_sends"] = ([{**r, "send_steps": [0, 1, 2, None][i % 4] if i % 7 else None} for i, r in enumerate(rows)],
                         flags(num_blocks=200, max_num_seqs=6, max_num_batched_tokens=192, role="both"))
    out.update(blocked_cases())
    out["hung"] = hung_load()
    out["abort_during_load"] = abort_during_load()
    out["producer"] = producer_sends()
    return out


def blocked_cases() -> dict:
    """Structured-output requests whose grammar is not ready (grammar futures) and failed loads (failed_recving),
    under both kv_load_failure_policy values (branch hold16)."""
    out = {"grammar_s0": grammars_and_failed_loads(n=120, seed=0, grammar=0.4, role=None),
           "grammar_fail_s1": grammars_and_failed_loads(n=200, seed=1),
           "recompute_s2": grammars_and_failed_loads(n=200, seed=2, grammar=0.2, fails=0.5,
                                                     extra=("--kv-load-failure-policy", "recompute"))}
    rows, fl = grammars_and_failed_loads(n=200, seed=3, grammar=0.3, fails=0.4, aborts=True,
                                         extra=("--enable-prefix-caching", "--kv-load-failure-policy", "recompute"))
    out["recompute_caching_aborts"] = ([{**r, **({"prefix_group": i % 4} if i % 2 else {})} for i, r in enumerate(rows)],
                                       fl)
    rows, fl = grammars_and_failed_loads(n=200, seed=4, grammar=0.3, fails=0.3, extra=("--policy", "priority"),
                                         aborts=True)
    out["grammar_fail_priority"] = ([{**r, "priority": i % 3} for i, r in enumerate(rows)], fl)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", default=None, help="directory to keep traces and logs in")
    args = ap.parse_args(argv)
    if venv_python() is None:
        print("the vLLM venv is absent (see shared/tools/vllm-scheduler/README.md): nothing to compare")
        return 0
    table = AgreementTable(["case", "steps", "preemptions", "loads", "steps agree", "share", "free blocks agree",
                            "first divergence"])
    jobs = cases()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    logs = run_jobs(jobs, keep=folder)
    table.header()
    for name, (rows, fl) in jobs.items():
        conf = compare(rows, fl, folder / f"{name}.log.jsonl", name, folder)
        log = logs[name]
        loads = len({r for line in log for r in line.get("loading", ())})
        preemptions = sum(len(line["preempted"]) for line in log)
        table.row(name, [name, conf.steps, preemptions, loads, conf.agreeing, share(conf), conf.free_blocks_agreeing,
                         first(conf)], conf)
    table.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
