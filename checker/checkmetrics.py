"""check-metrics: the properties a serving engine's Prometheus metrics can show, checked against a policy.

A step log (check-log) says what every step scheduled; a metrics scrape says much less, but every production
server exposes one. vLLM (``vllm:*``) and SGLang (``sglang:*``) publish gauges of the requests running and
waiting and of the KV cache in use, and counters of preemptions, tokens and prefix-cache lookups. Recorded over
time (``while sleep 5; do curl -s localhost:8000/metrics >> scrapes.prom; done``, or a Prometheus server's
``/api/v1/query_range`` answer), their aggregates still decide these properties, each against the policy:

- ``seq_cap``: the requests running never exceed ``batch.max_num_seqs``;
- ``kv_never_overcommitted``: the KV cache in use never exceeds the pool (usage <= 100 %);
- ``queue_bound``: the requests waiting never exceed ``admission.max_queue_len`` (VACUOUS when the policy has
  no queue bound);
- ``no_deadlock``: requests never wait for ``scrapes`` scrapes in a row with none running and no token
  produced (the "Running: 0, Waiting: N" stall that admission deadlocks show);
- ``prefix_caching_matches_policy``: the server looks prefixes up in its cache exactly when the policy has
  ``kv.prefix_caching.enabled`` (otherwise the policy batchcheck checks is not the scheduler that runs).

Each is judged per engine (the scrape's labels less ``model_name``: vLLM's ``engine``, SGLang's ranks). A
property whose series are not in the scrapes is UNKNOWN, one whose situation never occurs VACUOUS; a counter
that goes down is a restart, which splits the series (no_deadlock and the counters' deltas do not span it).
"""

from __future__ import annotations

import json
import math
from functools import partial
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from checker.errors import InputError, Problem
from checker.loading import parse_json, read_text
from checker.policy import Policy

# quantity -> the metric names that carry it, vLLM's then SGLang's
QUANTITIES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),  # both a fraction of the pool, 0..1
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_hits": ("vllm:prefix_cache_hits_total",),
}
COUNTERS = ("generation_tokens", "prompt_tokens", "preemptions", "prefix_queries", "prefix_hits")
NAME_OF = {name: quantity for quantity, names in QUANTITIES.items() for name in names}
ENGINE_LABELS_IGNORED = ("model_name",)
DEFAULT_STALL_SCRAPES = 3
CHECKS = ("seq_cap", "kv_never_overcommitted", "queue_bound", "no_deadlock", "prefix_caching_matches_policy")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

Engine = tuple[tuple[str, str], ...]  # the labels that name an engine


@dataclass
class Series:
    """One engine's quantities, one value per scrape (None where the scrape lacks it)."""

    engine: Engine
    values: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass
class Scrapes:
    source: str
    count: int
    times_s: list[float | None]
    series: dict[Engine, Series]
    server: str  # "vllm", "sglang" or "unknown"


@dataclass
class Finding:
    check: str
    verdict: str  # VIOLATED, HOLDS, VACUOUS, UNKNOWN
    detail: str
    engine: Engine = ()
    scrape: int | None = None  # the first scrape that shows the violation (0-based)


@dataclass
class CheckMetricsResult:
    scrapes: Scrapes
    findings: list[Finding]

    @property
    def violated(self) -> bool:
        return any(f.verdict == "VIOLATED" for f in self.findings)


# ----------------------------------------------------------------------------------------- reading scrapes
def parse_text(text: str, source: str) -> tuple[list[dict[tuple[str, Engine], float]], list[float | None]]:
    """Concatenated scrapes in the Prometheus text format. A scrape starts where a metric family's ``# HELP``
    or ``# TYPE`` line comes again (as ``curl >> file`` in a loop writes them), or at a comment line
    ``# scrape``; a sample's timestamp (ms), where given, is its scrape's time. Only the quantities batchcheck
    reads are kept."""
    scrapes: list[dict[tuple[str, Engine], float]] = []
    times: list[float | None] = []
    seen: set[str] = set()
    current: dict[tuple[str, Engine], float] | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            family = parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else None
            new = (family is not None and (family, parts[1]) in seen) or line.lower().startswith("# scrape")
            if current is None or new:
                current = {}
                scrapes.append(current)
                times.append(None)
                seen = set()
            if family is not None:
                seen.add((family, parts[1]))
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise InputError(Problem("line", line[:80], "a Prometheus sample: NAME{LABELS} VALUE [TIMESTAMP]",
                                     line_no), source)
        name, labels, value, stamp = match.groups()
        if current is None:
            current = {}
            scrapes.append(current)
            times.append(None)
        if name not in NAME_OF:
            continue
        number = _value(value, name, line_no, source)
        engine = _engine(labels or "", line_no, source)
        current[(name, engine)] = number
        if stamp is not None and times[-1] is None:
            times[-1] = int(stamp) / 1000
    return scrapes, times


def parse_query_range(data: object, source: str) -> tuple[list[dict[tuple[str, Engine], float]], list[float | None]]:
    """A Prometheus ``/api/v1/query_range`` answer (``resultType: matrix``), or a list of them: one scrape
    per timestamp that any series has."""
    answers = data if isinstance(data, list) else [data]
    by_time: dict[float, dict[tuple[str, Engine], float]] = {}
    for i, answer in enumerate(answers):
        where = f"[{i}]" if isinstance(data, list) else ""
        result = answer.get("data", {}).get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or answer.get("data", {}).get("resultType") != "matrix":
            raise InputError(Problem(f"{where}data.resultType", answer.get("data", {}).get("resultType")
                                     if isinstance(answer, dict) and isinstance(answer.get("data"), dict) else None,
                                     "matrix (the answer of /api/v1/query_range)"), source)
        for j, item in enumerate(result):
            metric = item.get("metric") if isinstance(item, dict) else None
            values = item.get("values") if isinstance(item, dict) else None
            if not isinstance(metric, dict) or not isinstance(values, list):
                raise InputError(Problem(f"{where}data.result[{j}]", "<malformed>", "{metric: {...}, values: "
                                         "[[time, value], ...]}"), source)
            name = metric.get("__name__")
            if name not in NAME_OF:
                continue
            engine = tuple(sorted((k, str(v)) for k, v in metric.items()
                                  if k not in ENGINE_LABELS_IGNORED and k not in ("__name__", "instance", "job")))
            for k, pair in enumerate(values):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise InputError(Problem(f"{where}data.result[{j}].values[{k}]", pair, "[time, value]"), source)
                t = _value(str(pair[0]), "time", None, source)
                by_time.setdefault(t, {})[(name, engine)] = _value(str(pair[1]), name, None, source)
    times = sorted(by_time)
    return [by_time[t] for t in times], list(times)


def _value(text: str, name: str, line: int | None, source: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(Problem(name, text, "a number", line), source) from None
    if not math.isfinite(value):
        raise InputError(Problem(name, text, "a finite number", line), source)
    return value


def _engine(labels: str, line: int, source: str) -> Engine:
    inner = labels[1:-1] if labels else ""
    pairs, pos = [], 0
    while pos < len(inner):
        match = _LABEL.match(inner, pos)
        if match is None:
            raise InputError(Problem("labels", labels[:80], 'name="value", ...', line), source)
        if match.group(1) not in ENGINE_LABELS_IGNORED:
            pairs.append((match.group(1), match.group(2)))
        pos = match.end()
    return tuple(sorted(pairs))


def load_scrapes(path: str | Path) -> Scrapes:
    """Scrapes from a file: the Prometheus text format (concatenated scrapes) or a query_range JSON answer."""
    source = str(path)
    text = read_text(path)  # within the input limits (docs/cli.md): split a longer recording
    if text.lstrip().startswith(("{", "[")):
        try:
            data = parse_json(text, source)
        except json.JSONDecodeError as exc:
            raise InputError(Problem("", "<unparsable>", f"JSON: {exc.msg}", exc.lineno), source) from None
        raw, times = parse_query_range(data, source)
    else:
        raw, times = parse_text(text, source)
    raw_times = [(s, t) for s, t in zip(raw, times) if s]
    if not raw_times:
        raise InputError(Problem("", "<no samples>", "scrapes with vLLM (vllm:num_requests_running, ...) or SGLang "
                                 "(sglang:num_running_reqs, ...) metrics"), source)
    raw, times = [s for s, _ in raw_times], [t for _, t in raw_times]
    series: dict[Engine, Series] = {}
    for k, scrape in enumerate(raw):
        for (name, engine), value in scrape.items():
            one = series.setdefault(engine, Series(engine))
            column = one.values.setdefault(NAME_OF[name], [None] * len(raw))
            column[k] = value
    names = {name for scrape in raw for name, _ in scrape}
    server = "vllm" if any(n.startswith("vllm:") for n in names) else "sglang" if names else "unknown"
    return Scrapes(source, len(raw), times, dict(sorted(series.items())), server)


# ----------------------------------------------------------------------------------------- the checks
def _engine_name(engine: Engine) -> str:
    return ", ".join(f"{k}={v}" for k, v in engine) or "the server"


def _at(scrapes: Scrapes, k: int) -> str:
    t = scrapes.times_s[k]
    return f"scrape {k + 1}" + (f" (t={t:g} s)" if t is not None else "")


def _known(values: list[float | None]) -> Iterator[tuple[int, float]]:
    return ((k, v) for k, v in enumerate(values) if v is not None)


def _bound(check: str, quantity: str, limit: float, what: str, limit_name: str,
           scale: Callable[[float], str] = lambda v: f"{v:g}") -> Callable[[Scrapes, Series, Policy], Finding]:
    def run(scrapes: Scrapes, s: Series, policy: Policy) -> Finding:
        values = s.values.get(quantity)
        if values is None:
            return Finding(check, "UNKNOWN", f"no {what} series in the scrapes ({' or '.join(QUANTITIES[quantity])})",
                           s.engine)
        known = list(_known(values))
        top = max(v for _, v in known)
        for k, v in known:
            if v > limit:
                return Finding(check, "VIOLATED", f"{what} {scale(v)} at {_at(scrapes, k)} > {limit_name} "
                                                  f"{scale(limit)}", s.engine, k)
        return Finding(check, "HOLDS", f"on {len(known)} scrapes ({what} at most {scale(top)}, {limit_name} "
                                       f"{scale(limit)})", s.engine)
    return run


def check_seq_cap(scrapes: Scrapes, s: Series, policy: Policy) -> Finding:
    return _bound("seq_cap", "running", policy.batch.max_num_seqs, "running requests",
                  "batch.max_num_seqs")(scrapes, s, policy)


def check_kv(scrapes: Scrapes, s: Series, policy: Policy) -> Finding:
    return _bound("kv_never_overcommitted", "kv_usage", 1.0, "KV cache usage", "the pool",
                  lambda v: f"{100 * v:.1f} %")(scrapes, s, policy)


def check_queue(scrapes: Scrapes, s: Series, policy: Policy) -> Finding:
    cap = policy.admission.max_queue_len
    if cap is None:
        return Finding("queue_bound", "VACUOUS", "the policy sets no admission.max_queue_len", s.engine)
    return _bound("queue_bound", "waiting", cap, "waiting requests", "admission.max_queue_len")(scrapes, s, policy)


def _segments(scrapes: Scrapes, s: Series) -> list[range]:
    """Scrape ranges without a restart (a counter that goes down)."""
    cuts = [0]
    for quantity in COUNTERS:
        last = None
        for k, v in _known(s.values.get(quantity, [])):
            if last is not None and v < last:
                cuts.append(k)
            last = v
    cuts = sorted(set(cuts)) + [scrapes.count]
    return [range(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def check_stall(scrapes: Scrapes, s: Series, policy: Policy, stall: int) -> Finding:
    running, waiting = s.values.get("running"), s.values.get("waiting")
    if running is None or waiting is None:
        return Finding("no_deadlock", "UNKNOWN", "no running or waiting series in the scrapes", s.engine)
    tokens = [s.values.get(q) for q in ("generation_tokens", "prompt_tokens") if s.values.get(q) is not None]
    waited = False
    for seg in _segments(scrapes, s):
        streak = 0
        for k in seg:
            r, w = running[k], waiting[k]
            if r is None or w is None:
                streak = 0
                continue
            waited = waited or w > 0
            produced = streak > 0 and any(col[k] is not None and col[k - 1] is not None and col[k] > col[k - 1]
                                          for col in tokens)
            streak = streak + 1 if (w > 0 and r == 0 and not produced) else 0
            if streak >= stall:
                first = k - stall + 1
                low, high = min(waiting[first:k + 1]), max(waiting[first:k + 1])
                count = f"{low:g}" if low == high else f"{low:g} to {high:g}"
                return Finding("no_deadlock", "VIOLATED", f"{count} requests waiting and none running from "
                                                          f"{_at(scrapes, first)} to {_at(scrapes, k)} ({stall} scrapes"
                                                          " in a row), no token produced", s.engine, first)
    if not waited:
        return Finding("no_deadlock", "VACUOUS", f"no request waited in {scrapes.count} scrapes", s.engine)
    return Finding("no_deadlock", "HOLDS", f"on {scrapes.count} scrapes (never {stall} in a row with requests "
                                           "waiting and none running)", s.engine)


def check_prefix_caching(scrapes: Scrapes, s: Series, policy: Policy) -> Finding:
    name = "prefix_caching_matches_policy"
    queries = s.values.get("prefix_queries")
    if queries is None:
        return Finding(name, "UNKNOWN", "no prefix-cache counters in the scrapes (vllm:prefix_cache_queries_total)",
                       s.engine)
    looked_up = None
    for seg in _segments(scrapes, s):
        known = [(k, queries[k]) for k in seg if queries[k] is not None]
        for (_, a), (k, b) in zip(known, known[1:]):
            if b > a:
                looked_up = k
                break
        if looked_up is not None:
            break
    on = policy.kv.prefix_caching.enabled
    if looked_up is not None and not on:
        return Finding(name, "VIOLATED", f"the server looks prompts up in its prefix cache "
                                         f"(vllm:prefix_cache_queries_total grows at {_at(scrapes, looked_up)}) but the "
                                         "policy has kv.prefix_caching.enabled false: the policy checked is not the "
                                         "scheduler that runs", s.engine, looked_up)
    if looked_up is None:
        return Finding(name, "VACUOUS" if not on else "HOLDS",
                       "no prefix-cache lookup in the scrapes" + (" (the policy has the cache on: no request was "
                                                                  "admitted, or the server runs without it)" if on else ""),
                       s.engine)
    return Finding(name, "HOLDS", "the server uses its prefix cache, as the policy says", s.engine)


CHECK_FUNCTIONS: dict[str, Callable[..., Finding]] = {
    "seq_cap": check_seq_cap, "kv_never_overcommitted": check_kv, "queue_bound": check_queue,
    "no_deadlock": check_stall, "prefix_caching_matches_policy": check_prefix_caching,
}


def check_metrics(policy: Policy, scrapes: Scrapes, checks: list[str] | None = None,
                  stall_scrapes: int = DEFAULT_STALL_SCRAPES) -> CheckMetricsResult:
    chosen = list(checks or CHECKS)
    for name in chosen:
        if name not in CHECK_FUNCTIONS:
            raise InputError(Problem("--check", name, "one of: " + ", ".join(CHECKS)))
    functions = {**CHECK_FUNCTIONS, "no_deadlock": partial(check_stall, stall=stall_scrapes)}
    findings = []
    for s in scrapes.series.values():
        if "running" not in s.values and "waiting" not in s.values and "kv_usage" not in s.values:
            continue  # a label set of other series only (e.g. a reason-split gauge): not an engine
        findings += [functions[name](scrapes, s, policy) for name in chosen]
    return CheckMetricsResult(scrapes, findings)


def render(result: CheckMetricsResult, policy_name: str) -> list[str]:
    sc = result.scrapes
    engines = sorted({f.engine for f in result.findings})
    lines = [f"{sc.source}: {sc.count} scrapes of {sc.server} metrics, {len(engines)} engine(s); policy {policy_name}"]
    for f in result.findings:
        where = f" [{_engine_name(f.engine)}]" if len(engines) > 1 else ""
        lines.append(f"{f.verdict:<10} {f.check:<30} {f.detail}{where}")
    return lines


def as_json(result: CheckMetricsResult, policy_name: str) -> dict:
    sc = result.scrapes
    return {"source": sc.source, "scrapes": sc.count, "server": sc.server, "policy": policy_name,
            "findings": [{"check": f.check, "verdict": f.verdict, "detail": f.detail,
                          "engine": dict(f.engine), "scrape": f.scrape} for f in result.findings]}
