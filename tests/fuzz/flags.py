"""Random flag combinations over every verb (issue 23), for the in-suite slice (tests/fuzz/test_flag_fuzz.py) and
the campaign's flag mode (bench/input_fuzz.py --flags).

A case is one verb, its positional arguments (shipped files of the right kind), and a random subset of its
options read from the command line's own parser (``checker.cli.build_parser``: a new flag is fuzzed the day it
is added): a switch on or off, a choice (now and then one that is not a choice), or a value drawn from a pool:
sane values for that flag, shipped files of its kind, and hostile ones (NaN, infinity, 2**63, negative, empty,
``../../x``, a folder, /dev/null/x). Every verb that has a time budget (``--timeout``, ``--time-budget``,
``--fuzz-budget``, ``--follow-idle-s``) is given a short one unless the case drew that flag itself (a hostile
value is then refused): a case over the campaign's hang limit ran past the budget it was given.

The contract is the input fuzz's (tests/fuzz/mutations.problem): an accepted run (exit 0, 1, 3), or exit 2
with one ``batchcheck: error:`` line (argparse's usage errors exit 2 too); never 101, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import random
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.mutations import ROOT, _without_heartbeats

SPEC = ROOT / "spec"
CHECKLOG = ROOT / "tests" / "data" / "checklog"

HOSTILE_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e400", "9223372036854775808", "-9223372036854775809", "",
                   "x", "1.5", "0x10", "1_000", " 3", "1e-300"]
HOSTILE_TEXT = ["", "../../ESCAPED_flag", "/dev/null/x", "{dir}", "{dir}/missing.yaml", "é"]

# Sane values for a flag (by its destination name); flags not named here draw from the hostile pools and
# from the files of their kind.
SANE: dict[str, list[str]] = {
    "requests": ["1", "2", "3", "4", "8", "20", "64"],
    "depth": ["1", "2", "3", "6", "12", "40"],
    "timeout": ["0.5", "1", "2"],
    "time_budget": ["0.5", "1", "2"],
    "fuzz_budget": ["0.5", "1", "2"],
    "follow_idle_s": ["0.2", "0.5"],
    "step_ms": ["10", "0.5", "1000"],
    "prompt_range": ["1:64", "10:2000", "5:5", "64:1", "1:100000000"],
    "output_range": ["1:4", "1:2048", "3:1"],
    "tenants": ["1", "2", "3", "9"],
    "arrivals_per_step": ["0", "1", "2", "3"],
    "max_states": ["10", "1000", "100000", "100000000"],
    "jobs": ["1", "2", "3"],
    "prompts": ["16,64", "1", "64,64,64", "100000"],
    "outputs": ["1,2", "1", "4000"],
    "priorities": ["0,1", "0", "0,1,2,3,4"],
    "identities": ["2", "1", "a,b"],
    "external": ["1", "0,1", "x"],
    "set": ["batch.max_num_seqs=1", "kv.num_blocks=4", "nope=1", "batch.max_num_seqs=x", "="],
    "limit": ["1", "5", "1000000", "9223372036854775807"],
    "window": ["0:10", "5:1", "0:1e9", "1e9:1e10"],
    "rate_scale": ["0.5", "2", "1e6"],
    "class_by_prompt": ["100,1000", "1000,100", "5"],
    "class_column": ["tenant", "missing"],
    "seed_windows": ["1", "5", "10000"],
    "max_examples": ["1", "5", "50"],
    "seed": ["0", "7", "4294967295"],
    "max_requests": ["1", "5", "100", "100000"],
    "threshold": ["0.1", "1", "nan"],
    "min_delta": ["0", "5"],
    "stall_scrapes": ["1", "3"],
    "gpu_memory_gib": ["80", "24", "0.001"],
    "model_weights_gib": ["14", "200"],
    "kv_bytes_per_token": ["131072", "1"],
    "overhead_gib": ["2", "100"],
    "vllm_version": ["0.6", "0.33", "0.8.5", "x", "99.0"],
    "name": ["imported", "../../ESCAPED_name"],
    "invariant": ["kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation", "tenant_fairness",
                  "decode_progress:1", "bounded_starvation:steps=4", "cancellation_releases:0", "nope",
                  "seq_cap:x=1", "work_conserving"],
    "invariant_module": ["tests.nope", "os", "json"],
    "property": ["eventually_served", "no_livelock", "nope"],
    "stress": ["burst", "nope"],
    "scheduler": ["local", "nope"],
    "base": ["HEAD", "nope"],
    "kind": ["policy", "workload", "nope"],
    "knob": ["replicas=1,2", "batch.max_num_seqs=4,8", "batch.max_num_batched_tokens=512", "replicas=0", "nope",
             "batch.max_num_seqs=x"],
}


def _glob(*patterns: str) -> list[str]:
    return sorted(str(p) for pattern in patterns for p in ROOT.glob(pattern))


# Files by the kind a flag or positional names (by its destination name).
FILES: dict[str, list[str]] = {
    "policy": _glob("spec/policies/*.yaml", "spec/policies/sglang/*.yaml", "spec/policies/prefix_caching/*.yaml"),
    "old": _glob("spec/policies/*.yaml"),
    "new": _glob("spec/policies/*.yaml"),
    "workload": _glob("spec/workloads/*.yaml"),
    "derive_workload": _glob("spec/workloads/*.yaml"),
    "fuzz_workload": [str(SPEC / "workloads" / "chat_mixed.yaml"), str(SPEC / "workloads" / "tiered_normal.yaml")],
    "slo": _glob("spec/slo/*.yaml", "spec/workloads/*.slo.yaml"),
    "profile": _glob("spec/profiles/*.json"),
    "trace": _glob("tests/data/vllm_metrics/*.trace.json") + ["{dir}/trace.csv"],
    "seed_trace": ["{dir}/trace.csv"],
    "counterexample": _glob("counterexamples/*.json"),
    "contract": _glob("spec/audit/*contract.yaml"),
    "log": ["{dir}/log.jsonl"],
    "arrivals": [str(CHECKLOG / "arrivals.json")],
    "scrapes": ["{dir}/scrapes.prom"],
    "config": ["{dir}/vllm.yaml", "{dir}/batchcheck.toml"],
    "files": _glob("spec/policies/*.yaml", "spec/workloads/*.yaml", "spec/profiles/*.json"),
    "certificate": ["{dir}/cert.smt2", "{dir}/proved.smt2", "{dir}/proved.smt2"],
    "knob": ["replicas=1,2", "batch.max_num_seqs=4,8"],  # sweep's knobs and a short run (NEEDS below): a sweep
    "limit": ["20", "60"],  # of a whole workload per case would be slow; other verbs' --limit draw these too
    "fleet": [f for f in _glob("spec/fleets/*.yaml") if not f.endswith(".slo.yaml")],
}
# What a verb needs to run at all, added (unless drawn) to most of its cases: without it nearly every case
# would stop at the same usage error.
NEEDS: dict[tuple[str, ...], list[tuple[str, str]]] = {
    ("simulate",): [("--workload", "workload")],
    ("fuzz",): [("--workload", "fuzz_workload")],
    ("audit",): [("--policy", "policy"), ("--workload", "derive_workload")],
    ("import",): [("--config", "config")],
    ("recheck",): [("--policy", "policy")],
    ("sweep",): [("--knob", "knob"), ("--limit", "limit")],
}
GENERIC = ["1", "2", "4", "16"]  # sane values of a number flag not in SANE
# Output flags: a fresh path in the case's folder (or a hostile one).
OUTPUTS = {"out", "proof_dir", "database", "plot", "junit", "sarif", "summary"}
BUDGETS = {"timeout": "1", "time_budget": "1", "fuzz_budget": "1", "follow_idle_s": "0.2"}

# Companion files a case may name ({dir}/...).
AZURE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,40,3\n0.25,700,2\n1.5,64,4\n"
VLLM_CONFIG = "max_model_len: 4096\nnum-gpu-blocks-override: 500\nmax_num_seqs: 4\n"
CI_CONFIG = ('policies = ["{root}/spec/policies/vllm_v1.yaml"]\n[defaults]\nrequests = 2\ndepth = 1\n'
             'timeout_s = 2\nunbounded = false\n[[verify]]\ninvariants = ["seq_cap"]\n')
CERTIFICATE = "; batchcheck certificate\n(assert false)\n"


def _companions(folder: Path) -> None:
    import gzip

    with gzip.open(CHECKLOG / "vllm_fcfs.log.jsonl.gz", "rt") as f:
        log = "".join(next(f) for _ in range(30))
    with gzip.open(ROOT / "tests" / "data" / "vllm_metrics" / "pressure.prom.gz", "rt") as f:
        scrapes = f.read()
    files = {"trace.csv": AZURE, "vllm.yaml": VLLM_CONFIG, "batchcheck.toml": CI_CONFIG.format(root=ROOT),
             "log.jsonl": log, "cert.smt2": CERTIFICATE, "scrapes.prom": scrapes, "proved.smt2": _proved()}
    for name, text in files.items():
        (folder / name).write_text(text)


@functools.cache
def _proved() -> str:
    """A real certificate (seq_cap PROVED for vllm_v1, 1 slot), made once per process for recheck's cases."""
    import tempfile

    from checker.api import run_verify

    with tempfile.TemporaryDirectory() as tmp:
        run_verify(str(SPEC / "policies" / "vllm_v1.yaml"), ["seq_cap"], requests=1, depth=1, timeout_s=30,
                   out_dir=None, unbounded=True, proof_dir=tmp)
        found = sorted(Path(tmp).glob("*.smt2"))
        return found[0].read_text() if found else CERTIFICATE


@dataclass(frozen=True)
class Verb:
    """A verb's argv prefix (``calibrate fit``: two words) and its parser."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser


def verbs() -> list[Verb]:
    """Every verb of the command line (and every step of a verb with steps, e.g. ``calibrate fit``)."""
    from checker.cli import build_parser

    out: list[Verb] = []

    def walk(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append(Verb(words, parser))
            return
        for name, sub in subs[0].choices.items():
            walk(words + (name,), sub)

    walk((), build_parser())
    return out


def _value(dest: str, action: argparse.Action, rnd: random.Random) -> str:
    if action.choices:
        return rnd.choice(list(action.choices)) if rnd.random() < 0.95 else "nope"
    if dest in OUTPUTS:
        return rnd.choice(["{dir}/" + dest, "{dir}/" + dest, "{dir}", "/dev/null/x", "", "{dir}/cert.smt2"])
    pools = [SANE.get(dest, []), FILES.get(dest, [])]
    pool = [v for p in pools for v in p] or (GENERIC if action.type is not None else [])
    if pool and rnd.random() < 0.9:
        return rnd.choice(pool)
    return rnd.choice(HOSTILE_NUMBERS if action.type is not None else HOSTILE_TEXT)


def argv_for(verb: Verb, rnd: random.Random) -> list[str]:
    """A random argv for ``verb`` (``{dir}`` left for the case's folder)."""
    argv = list(verb.words)
    optionals = [a for a in verb.parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
                 and "--version" not in a.option_strings]
    positionals = [a for a in verb.parser._actions if not a.option_strings]
    chosen = rnd.sample(optionals, min(len(optionals), rnd.choice((0, 1, 2, 2, 3, 3, 4, 5))))
    required = [a for a in optionals if a.required and a not in chosen]
    drawn = {a.dest for a in chosen}
    for action in chosen + required:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
            continue
        for _ in range(rnd.choice((1, 1, 2)) if isinstance(action, argparse._AppendAction) else 1):
            argv.append(f"{flag}={_value(action.dest, action, rnd)}")  # FLAG=VALUE: a value may start with "-"
    for flag, kind in NEEDS.get(verb.words, []):
        if flag not in {a.option_strings[-1] for a in chosen} and rnd.random() < 0.85:
            argv.append(f"{flag}={rnd.choice(FILES[kind])}")
    for action in optionals:  # a short budget where the verb has one and the case did not draw it
        if action.dest in BUDGETS and action.dest not in drawn:
            argv += [action.option_strings[-1], BUDGETS[action.dest]]
    if verb.words == ("ci",) and "config" not in drawn:  # never the repository's own batchcheck.toml (a minute)
        argv += ["--config", "{dir}/batchcheck.toml"]
    for action in positionals:
        if action.nargs == argparse.REMAINDER:
            argv += rnd.choice(([], ["--max-model-len", "4096"], ["--max-num-seqs", "nan"], ["--bogus"]))
            continue
        count = {"?": rnd.choice((0, 1)), "*": rnd.choice((0, 1, 2)), "+": rnd.choice((1, 2))}.get(action.nargs, 1)
        for _ in range(count if not isinstance(action.nargs, int) else action.nargs):
            argv.append(_value(action.dest, action, rnd))
    return argv


def run_flags(argv: list[str], folder: Path) -> tuple[int, str]:
    """Run ``argv`` (``{dir}`` filled in with ``folder``) through the command line in process: (exit, stderr)."""
    from checker.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    _companions(folder)
    argv = [a.replace("{dir}", str(folder)) for a in argv]
    err = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:  # in the case's folder: outputs a verb writes by default (counterexamples/, proofs/) land there
            code = main(argv)
        except SystemExit as exc:  # argparse's usage error (exit 2) or --help (exit 0)
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


def flag_problem(code: int, err: str) -> str | None:
    """What breaks the contract in a flag case's outcome, or None."""
    err = _without_heartbeats(err)
    if code == 101 or "internal error" in err or "Traceback" in err:
        return f"internal error (exit {code}): {err.strip()[-300:]}"
    if code not in (0, 1, 2, 3):
        return f"exit {code}"
    if code == 2 and not (err.startswith("batchcheck: error: ") or err.startswith("usage: ")):
        return f"exit 2 without the error line: {err[:200]!r}"
    return None
