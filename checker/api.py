"""The library API the CLI calls: load inputs, validate files, run simulations."""

from __future__ import annotations

from pathlib import Path

from checker.audit import AuditContract, AuditResult, AuditWorkload
from checker.engine import SimResult, simulate
from checker.errors import InputError, Problem
from checker.fuzz.slo import SLOFile
from checker.loading import load_document, validate
from checker.policy import Policy
from checker.profile import Profile, load_profile
from checker.traces import Trace, TraceOptions, load_azure_csv, load_requests
from checker.workload import Workload

MODELS = {"policy": Policy, "workload": Workload, "trace": Trace, "profile": Profile}
MODELS.update({"audit-contract": AuditContract, "audit-workload": AuditWorkload})  # batchcheck audit's records
MODELS["slo"] = SLOFile


def load_policy(path: str | Path) -> Policy:
    data, lines = load_document(path)
    policy = validate(Policy, data, str(path), lines)
    if policy.name is None:
        policy = policy.model_copy(update={"name": Path(path).stem})
    return policy


def json_schema(kind: str) -> dict:
    return MODELS[kind].model_json_schema()


def guess_kind(path: str | Path, data: object) -> str:
    if str(path).endswith(".csv"):
        return "trace"
    if isinstance(data, dict):
        if data.get("format") == "batchcheck-trace":
            return "trace"
        if data.get("format") == "batchcheck-profile":
            return "profile"
        if data.get("format") == "batchcheck-slo":
            return "slo"
        if data.get("format") in ("batchcheck-audit-contract", "batchcheck-audit-workload"):
            return str(data["format"]).removeprefix("batchcheck-")
        if "classes" in data:
            return "workload"
        if "kv" in data or "max_model_len" in data:
            return "policy"
    raise InputError(Problem("", Path(path).name, "a policy (has kv:), workload (has classes:), "
                             "trace (format: batchcheck-trace) or profile; or pass --kind"), str(path))


def validate_file(path: str | Path, kind: str | None = None) -> str:
    """Validate one input file; return its kind. Raises InputError on any problem."""
    if str(path).endswith(".csv"):
        load_azure_csv(path)
        return "trace"
    data, lines = load_document(path)
    kind = kind or guess_kind(path, data)
    validate(MODELS[kind], data, str(path), lines)
    return kind


def run_simulation(policy: str | Path, workload: str | Path | None = None, trace: str | Path | None = None,
                   profile: str | Path | None = None, limit: int | None = None, record: bool = False,
                   options: TraceOptions | None = None) -> SimResult:
    pol = load_policy(policy)
    prof: Profile = load_profile(profile)
    requests = load_requests(workload=workload, trace=trace, limit=limit, options=options)
    return simulate(pol, requests, prof, record=record)


# ----------------------------------------------------------------------------------------- capacity audit
def run_audit(contract: str | Path, workload: str | Path) -> AuditResult:
    """The fluid capacity audit of an audit workload record against the contract it names (docs/audit.md)."""
    from checker.audit import audit_files

    return audit_files(contract, workload)


def trace_requests(trace: str | Path, options: TraceOptions | None = None):
    """A trace's requests with the trace options applied; an input error when the window holds none."""
    rs = load_requests(trace=trace, options=options)
    if not rs.specs:
        window = options.window_s if options is not None else None
        shown = "<none>" if window is None else f"{window[0]:g}:{window[1]:g}"
        raise InputError(Problem("--window", shown, "a window holding at least one request of the trace"),
                         str(trace))
    return rs


def run_derived_audit(policy: str | Path, workload: str | Path | None = None, profile: str | Path | None = None, *,
                      queue_slo_ms: int | None = None, ttft_slo_ms: int | None = None,
                      tpot_slo_ms: int | None = None, trace: str | Path | None = None,
                      trace_options: TraceOptions | None = None) -> AuditResult:
    """The audit of the contract and workload record derived from a policy, a profile (default:
    spec/profiles/default_linear.json) and a batchcheck workload: the system `simulate` runs. With
    ``trace`` instead of ``workload``, the classes and their rates come from a real trace (docs/audit.md,
    "Class rates from a real trace")."""
    from checker.audit import audit, content_id
    from checker.audit.derive import derive
    from checker.loading import load_model
    from checker.profile import DEFAULT_PROFILE

    pol = load_policy(policy)
    prof = load_profile(profile)
    sources = {"policy_source": str(policy), "profile_source": str(profile or DEFAULT_PROFILE),
               "queue_slo_ms": queue_slo_ms, "ttft_slo_ms": ttft_slo_ms, "tpot_slo_ms": tpot_slo_ms}
    if trace is not None:
        from checker.audit.from_trace import derive_from_trace

        rs = trace_requests(trace, trace_options)
        contract, record, derivation = derive_from_trace(pol, prof, rs, trace_source=str(trace), **sources)
    else:
        wl = load_model(Workload, workload)
        contract, record, derivation = derive(pol, prof, wl, workload_source=str(workload), **sources)
    return audit(contract, record, content_id(contract), content_id(record), derived=derivation)


# ----------------------------------------------------------------------------------------- verification
DEFAULT_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")


def run_verify(policy: str | Path, invariants: list[str] | None = None, requests: int = 3, depth: int = 5,
               timeout_s: float = 60.0, workload: str | Path | None = None, out_dir: str | Path | None = "counterexamples",
               prompt: tuple[int, int] | None = None, output: tuple[int, int] | None = None,
               cancellations: bool = True, step_ms: float = 10.0, unbounded: bool = False,
               proof_dir: str | Path | None = "proofs", invariant_modules: list[str] | None = None,
               progress=None):
    """Check invariants of a policy with z3 (bounded model checking); returns (environment, results)."""
    from checker.loading import load_model
    from checker.verify.env import default_environment
    from checker.verify.run import check_one, parse_invariant
    from invariants.plugins import load_entry_points, load_module

    load_entry_points()
    for module in invariant_modules or []:
        load_module(module)
    pol = load_policy(policy)
    chosen = [parse_invariant(text) for text in (invariants or DEFAULT_INVARIANTS)]
    wl = load_model(Workload, workload) if workload is not None else None
    env = default_environment(pol, requests, depth, wl, prompt, output, cancellations, round(step_ms * 1000))
    out = Path(out_dir) if out_dir is not None else None
    proofs = Path(proof_dir) if proof_dir is not None else None
    return env, [check_one(pol, str(policy), inv, params, env, timeout_s, out, unbounded, proofs, progress)
                 for inv, params in chosen]


def run_recheck(certificate: str | Path) -> tuple[str, int]:
    """Re-check a proof certificate with a fresh solver: ('unsat', queries) confirms it (a certificate of
    action-wise induction holds one query per scheduler action, whole-step induction one)."""
    from checker.loading import read_text
    from checker.smt.ops import CERTIFICATE_BLOCK, recheck_smt2

    text = read_text(certificate)
    return recheck_smt2(text), max(1, text.count(CERTIFICATE_BLOCK))


def run_replay(counterexample: str | Path, policy: str | Path | None = None) -> tuple[str, bool]:
    """Re-run a counterexample on the engine (under its own policy, or under another one). Returns the
    text to show (an iteration or request table and a verdict line) and whether it still fails."""
    from checker.verify import counterexample as cex
    from checker.verify.replay import replay_counterexample, replay_table

    pol = load_policy(policy) if policy is not None else None
    doc = cex.load(counterexample)
    if doc["property"].get("kind") == "slo":
        from checker.fuzz.counterexample import replay as replay_slo

        r = replay_slo(doc, pol)
        head = f"replaying {counterexample} under policy {r.policy.name}"
        o = r.outcome
        verdict = (f"{r.prop.name} VIOLATED: observed {o.observed} > allowed {o.allowed} ({o.detail}); recorded "
                   f"observed {r.recorded.get('observed')}" if r.violated else
                   f"{r.prop.name} holds on this trace (observed {o.observed}, allowed {o.allowed}): "
                   "the policy no longer fails it")
        return "\n".join([head, r.table, verdict]), r.violated
    report = replay_counterexample(counterexample, pol)
    head = f"replaying {counterexample} under policy {report.policy.name}"
    name = report.invariant.name
    verdict = (f"{name} holds on this trace: the policy no longer fails it" if report.violation is None else
               f"{name} VIOLATED at iteration {report.violation} (recorded: iteration {report.recorded_violation})")
    return "\n".join([head, replay_table(report), verdict]), report.violation is not None


# ----------------------------------------------------------------------------------------- runtime verification
CHECK_LOG_INVARIANTS = ("kv_never_overcommitted", "token_budget", "seq_cap", "request_conservation")


def run_check_log(policy: str | Path, log: str | Path, arrivals: str | Path, invariants: list[str] | None = None,
                  with_conformance: bool = False):
    """Check invariants on a real scheduler's per-step log; optionally compare it with the engine."""
    from checker.checklog import check_log, conformance, load_arrivals, load_log
    from checker.verify.run import parse_invariant

    pol = load_policy(policy)
    arr = load_arrivals(arrivals)
    steps = load_log(log, arr)
    chosen = [parse_invariant(text) for text in (invariants or CHECK_LOG_INVARIANTS)]
    violation, notes = check_log(pol, arr, steps, chosen)
    conf = conformance(pol, arr, steps) if with_conformance else None
    return len(steps), chosen, violation, notes, conf


# ----------------------------------------------------------------------------------------- fuzzing
def slo_file_for(workload: str | Path) -> Path:
    """The SLO file declared next to a workload: ``name.yaml`` -> ``name.slo.yaml``."""
    path = Path(workload)
    return path.with_name(path.stem + ".slo.yaml")


def load_slo(workload: str | Path, slo: str | Path | None, properties: list[str] | None):
    """The workload, the SLO file (given, or declared next to the workload) and the chosen properties,
    checked against each other (every class an SLO property names is a class of the workload)."""
    from checker.loading import load_model

    wl = load_model(Workload, workload)
    slo_path = Path(slo) if slo is not None else slo_file_for(workload)
    if slo is None and not slo_path.exists():
        raise InputError(Problem("--slo", "<none>", f"an SLO file (none given, and no {slo_path.name} next to the "
                                 "workload)"))
    slo_file = load_model(SLOFile, slo_path)
    known = {p.name: p for p in slo_file.properties}
    for name in properties or []:
        if name not in known:
            raise InputError(Problem("--property", name, "one of: " + ", ".join(known)), str(slo_path))
    for prop in slo_file.properties:
        classes = [getattr(prop, attr, None) for attr in ("request_class", "protected", "background")]
        for cls in classes:
            if cls is not None and cls not in [c.name for c in wl.classes]:
                raise InputError(Problem(f"properties.{prop.name}", cls, "a class of the workload: " +
                                         ", ".join(c.name for c in wl.classes)), str(slo_path))
    chosen = [known[name] for name in properties] if properties else list(slo_file.properties)
    return wl, slo_path, chosen


def run_fuzz(policy: str | Path, workload: str | Path, slo: str | Path | None = None,
             properties: list[str] | None = None, max_examples: int = 200, time_budget_s: float = 60.0,
             seed: int = 0, profile: str | Path | None = None, out_dir: str | Path | None = "counterexamples",
             database_dir: str | Path | None = ".batchcheck/hypothesis", max_requests: int = 20,
             stresses: list[str] | None = None, progress=None, seed_trace: str | Path | None = None,
             trace_options: TraceOptions | None = None, seed_windows: int = 20):
    """Search adversarial traces for SLO violations (one Hypothesis search per property); save and
    return the shrunk, replayed counterexamples. With ``seed_trace``, the trace's ``seed_windows`` busiest
    windows of at most ``max_requests`` requests run first (docs/fuzz.md, "Seeding from a real trace")."""
    from checker.fuzz import counterexample as fuzz_cex
    from checker.fuzz.run import run_property
    from checker.fuzz.strategies import STRESSES, to_requests
    from checker.verify.counterexample import save

    pol = load_policy(policy)
    wl, slo_path, chosen = load_slo(workload, slo, properties)
    for name in stresses or []:
        if name not in STRESSES:
            raise InputError(Problem("--stress", name, "one of: " + ", ".join(STRESSES)))
    prof = load_profile(profile)
    corpus = None
    if seed_trace is not None:
        from checker.fuzz.seeds import seed_corpus

        if seed_windows < 1:
            raise InputError(Problem("--seed-windows", seed_windows, "at least 1"))
        corpus = seed_corpus(trace_requests(seed_trace, trace_options), wl, max_requests, seed_windows, str(seed_trace))
    results = []
    for prop in chosen:
        result = run_property(pol, wl, prof, prop, max_examples, time_budget_s / len(chosen), seed,
                              Path(database_dir) if database_dir is not None else None, max_requests, stresses, progress,
                              corpus)
        if corpus is not None:
            result.seed_notes = corpus.notes(str(seed_trace))
        if result.violated and out_dir is not None:
            requests = to_requests(result.trace, wl, "fuzz")
            search = {"seed": seed, "max_examples": max_examples, "examples_run": result.examples,
                      "stresses": stresses or list(STRESSES), "max_requests_per_stress": max_requests,
                      "workload": str(workload), "slo": str(slo_path)}
            if seed_trace is not None:
                search.update(seed_trace=str(seed_trace), seed_windows_run=result.seeds_run,
                              found_in_seed_window=result.seed_found)
            doc = fuzz_cex.build(pol, str(policy), prof, prop, result.outcome, requests, search)
            replayed = fuzz_cex.replay(doc)
            if not replayed.violated:
                from checker.errors import InternalError

                raise InternalError(f"the shrunk trace for {prop.name} does not fail when replayed "
                                    f"(observed {replayed.outcome.observed}, allowed {replayed.outcome.allowed})")
            result.counterexample = save(doc, Path(out_dir))
        results.append(result)
    return results


# ----------------------------------------------------------------------------------------- diff
DIFF_INVARIANTS = DEFAULT_INVARIANTS + ("no_deadlock", "decode_progress")


def run_diff(old: str | Path, new: str | Path, workload: str | Path | None = None, slo: str | Path | None = None,
             invariants: list[str] | None = None, requests: int = 3, depth: int = 5, timeout_s: float = 60.0,
             profile: str | Path | None = None, threshold: float = 0.2, min_delta: float = 1.0,
             max_examples: int = 100, fuzz_budget_s: float = 60.0, seed: int = 0,
             out_dir: str | Path | None = "counterexamples", prompt: tuple[int, int] | None = None,
             output: tuple[int, int] | None = None, unbounded: bool = False, slo_properties: list[str] | None = None,
             audit: bool = True, slo_must_violate: bool = False, progress=None):
    """What a policy change breaks: invariant verdicts side by side with witnesses each way (z3), SLO
    regression witnesses on generated traces (when a workload has an SLO file), and the audit of both."""
    import time

    from checker.diff.compare import Pair, diff_invariant, diff_slo
    from checker.diff.run import AuditPair, DiffReport, changed_fields
    from checker.diff.slo import Tolerance
    from checker.loading import load_model
    from checker.verify.env import default_environment
    from checker.verify.run import parse_invariant

    started = time.monotonic()
    pair = Pair(load_policy(old), load_policy(new), str(old), str(new))
    if pair.old.name == pair.new.name:
        pair.new = pair.new.model_copy(update={"name": f"{pair.new.name} (new)"})
    if pair.old.kv.block_size != pair.new.kv.block_size:  # pools and KV figures in different units
        _, lines = load_document(new)
        raise InputError(Problem("kv.block_size", pair.new.kv.block_size,
                                 f"the same KV block size as OLD {old} ({pair.old.kv.block_size} tokens per block) to "
                                 "compare their pools", lines().get(("kv", "block_size"))), str(new))
    if not 0 <= threshold <= 100:
        raise InputError(Problem("--threshold", threshold, "a relative increase between 0 and 100 (0.2 = 20 %)"))
    if workload is None and (slo is not None or slo_properties):
        from checker.errors import UsageError

        raise UsageError("--slo and --property need --workload (the traces are generated from its classes)")
    chosen = [parse_invariant(text) for text in (invariants if invariants is not None else DIFF_INVARIANTS)]
    wl, slo_chosen = None, []  # every input is read and checked before the first solver call
    if workload is not None and (slo is not None or slo_properties or slo_file_for(workload).exists()):
        wl, _, slo_chosen = load_slo(workload, slo, slo_properties)
    elif workload is not None:
        wl = load_model(Workload, workload)
    prof = load_profile(profile) if slo_chosen else None
    widest = pair.old if pair.old.max_model_len >= pair.new.max_model_len else pair.new
    env = default_environment(widest, requests, depth, wl, prompt, output) if chosen else None
    out = Path(out_dir) if out_dir is not None else None
    props = [diff_invariant(pair, inv, params, env, timeout_s, out, unbounded, progress) for inv, params in chosen]
    audit_pair = None
    if slo_chosen:
        tolerance = Tolerance(threshold, min_delta, slo_must_violate)
        props += [diff_slo(pair, wl, prof, prop, tolerance, max_examples, fuzz_budget_s / len(slo_chosen), seed,
                           out, progress) for prop in slo_chosen]
    if workload is not None and audit:
        a, b = (run_derived_audit(p, workload, profile) for p in (old, new))
        audit_pair = AuditPair(a.text(), b.text(), a.decision, b.decision)
    return DiffReport(pair.old, pair.new, str(old), str(new), env, props, audit_pair,
                      changed_fields(pair.old, pair.new), time.monotonic() - started)


# ----------------------------------------------------------------------------------------- importers
def run_import(system: str, args: list[str] | tuple[str, ...] = (), config: str | Path | None = None, *,
               out: str | Path | None = None, name: str | None = None, vllm_version: str | None = None,
               usage_context: str | None = None, gpu_memory_gib: float | None = None,
               model_weights_gib: float | None = None, kv_bytes_per_token: int | None = None,
               overhead_gib: float | None = None, profile: str | Path | None = None):
    """Import a real server's scheduler configuration as a policy (docs/importers.md): ``system`` is one
    of vllm, sglang, tgi, trtllm, triton; ``args`` are that server's own arguments; ``config`` its config
    file (vLLM YAML, TensorRT-LLM LLM-API YAML, Triton config.pbtxt). The machine options size a KV pool
    that the server would compute at start-up. Returns an ImportResult (validated policy, YAML text, the
    assumed / approximated / ignored notes); with ``out``, also writes the YAML there atomically. Raises
    InputError/UsageError (exit 2) for an option the policy model cannot express or does not know."""
    from checker.importers import import_policy
    from checker.importers.common import Machine
    from checker.importers.output import write_atomic

    machine = Machine(gpu_memory_gib, model_weights_gib, kv_bytes_per_token, overhead_gib, profile)
    result = import_policy(system, list(args), config, name=name, machine=machine, vllm_version=vllm_version,
                           usage_context=usage_context)
    if out is not None:
        write_atomic(out, result.text)
    return result


# ----------------------------------------------------------------------------------------- CI gating
def run_ci(config: str | Path = "batchcheck.toml", jobs: int | None = None, scheduler=None,
           junit: str | None = None, sarif: str | None = None, summary: str | None = None,
           policies: list[str] | None = None, done=None):
    """Run the checks a project config (batchcheck.toml, docs/ci.md) names, in parallel (``jobs`` local
    processes, or a Dask ``scheduler`` address / distributed.Client); write JUnit XML, SARIF 2.1.0 and a
    markdown summary once all have finished. ``policies``: only the checks of these policy files. Returns
    a checker.ci.run.CiOutcome (findings, exit code). Bad config: InputError (exit 2), nothing written."""
    from checker.ci.run import run_ci as _run_ci

    return _run_ci(config, jobs, scheduler, junit, sarif, summary, policies, done)


# ----------------------------------------------------------------------------------------- liveness
def apply_overrides(policy: Policy, overrides: list[str] | None) -> Policy:
    """The policy with FIELD.PATH=VALUE settings applied (VALUE read as YAML), validated again."""
    import yaml

    from checker.loading import validate

    if not overrides:
        return policy
    data = policy.model_dump(mode="json")
    for text in overrides:
        path, eq, raw = text.partition("=")
        parts = path.split(".") if path else []
        if not eq or not parts or not all(parts):
            raise InputError(Problem("--set", text, "FIELD.PATH=VALUE, e.g. batch.max_num_seqs=1"))
        node = data
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}  # an unknown section: validation below names it
            node = node[part]
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise InputError(Problem("--set", text, "a YAML value after '='")) from None
    return validate(Policy, data, "--set")


def run_liveness(policy: str | Path, properties: list[str] | None = None, requests: int = 2,
                 prompts: tuple[int, ...] | None = None, outputs: tuple[int, ...] = (1, 2),
                 priorities: tuple[int, ...] | None = None, tenants: int = 1, cancellations: bool = False,
                 arrivals_per_step: int | None = None, step_ms: float = 10.0, overrides: list[str] | None = None,
                 max_states: int | None = None, timeout_s: float = 60.0,
                 out_dir: str | Path | None = "counterexamples", progress=None, jobs: int = 1):
    """Explore the policy's reachable states for a small instance into a networkx graph and check
    eventually_served, no_livelock and no_deadlock on it (docs/liveness.md); returns a LivenessReport.
    Defaults: prompts of one KV block, priorities 0 and 1 when the policy reads priorities (else 0).
    ``jobs`` > 1 explores with that many worker processes (the same graph)."""
    from checker.liveness.check import check_liveness
    from checker.liveness.explore import DEFAULT_MAX_STATES
    from checker.liveness.lasso import PROPERTIES

    for name in properties or []:
        if name not in PROPERTIES:
            raise InputError(Problem("--property", name, "one of: " + ", ".join(PROPERTIES)))
    if jobs < 1:
        raise InputError(Problem("--jobs", jobs, ">= 1"))
    pol = apply_overrides(load_policy(policy), overrides)
    env = liveness_env(pol, requests, prompts, outputs, priorities, tenants, cancellations, arrivals_per_step, step_ms)
    return check_liveness(pol, str(policy), env, properties, max_states or DEFAULT_MAX_STATES, timeout_s,
                          Path(out_dir) if out_dir is not None else None, overrides, progress, jobs)


def liveness_env(pol: Policy, requests: int = 2, prompts: tuple[int, ...] | None = None,
                 outputs: tuple[int, ...] = (1, 2), priorities: tuple[int, ...] | None = None, tenants: int = 1,
                 cancellations: bool = False, arrivals_per_step: int | None = None, step_ms: float = 10.0):
    """The LivenessEnv of an instance of ``pol``, with run_liveness's defaults; InputError (naming the
    liveness option) for an instance that cannot be explored, e.g. a step that does not divide the aging
    interval."""
    from checker.liveness.canon import Canon
    from checker.liveness.explore import LivenessEnv

    reads_priority = pol.queue.uses_priority or pol.preemption.victim.value == "lowest_priority"
    env = LivenessEnv(requests, tuple(prompts or (pol.kv.block_size,)), tuple(outputs),
                      tuple(priorities or ((0, 1) if reads_priority else (0,))), tenants, cancellations,
                      arrivals_per_step, round(step_ms * 1000))
    Canon(pol, env.step_us, env.priorities, env.tenants)  # checks the clock against the policy's aging
    return env


# ----------------------------------------------------------------------------------------- bug reports
def run_report(counterexample: str | Path, out_dir: str | Path = "reports"):
    """Replay a counterexample on the engine and write a markdown bug report and a PNG timeline into
    ``out_dir`` (docs/report.md). Returns the ReportFiles; InputError (exit 2) for a bad file or an
    unwritable directory, with nothing written."""
    from checker.bugreport.build import write_report

    return write_report(counterexample, out_dir)


def write_run_plot(result: SimResult, path: str | Path) -> Path:
    """The timeline PNG of a run simulated with ``record=True`` (``simulate --plot``)."""
    from checker.bugreport.build import write_run_plot as write_plot

    return write_plot(result, path)
