"""Triton Inference Server model configuration (``config.pbtxt``, the dynamic batcher) -> policy.

Semantics: shared/reference/serving-schedulers.md section 5. When the model instance is free, the
dynamic batcher takes up to ``max_batch_size`` requests from the queue head (priority level 1 first, FIFO
within a level) and the batch runs as one unit until its longest request finishes: ``phase_mode: static``.
Triton does not manage a KV cache and does not know the model's context length, so ``--max-model-len``
is required and the pool is sized to hold a full batch (it never binds).
"""

from __future__ import annotations

from typing import Any

from checker.errors import InputError, Problem, UsageError
from checker.importers.common import Arg, Draft, Opt, Table, missing, parse_cli
from checker.importers.refusals import refuse_later, unknown_option
from checker.importers.pbtxt import Field, Ident, Message, parse_pbtxt
from checker.policy import MAX_BLOCKS, MAX_TOKENS

SYSTEM = "triton"
TABLE = Table("Triton", [Opt("max-model-len", "tokens", minimum=2)])
NO_EFFECT = {"name", "platform", "backend", "runtime", "version_policy", "input", "output", "batch_input",
             "batch_output", "optimization", "default_model_filename", "cc_model_filenames", "metric_tags",
             "parameters", "model_warmup", "model_operations", "model_repository_agents", "response_cache"}
KNOWN = NO_EFFECT | {"max_batch_size", "dynamic_batching", "instance_group", "sequence_batching",
                     "ensemble_scheduling", "model_transaction_policy"}
ITERATION_BACKENDS = {"vllm": "vllm", "tensorrtllm": "trtllm"}
KV_BLOCK = 16


class _Cfg:
    """Typed access to the fields of one config.pbtxt message, with errors that name file, line and path."""

    def __init__(self, msg: Message, path: str, source: str):
        self.msg, self.path, self.source = msg, path, source

    def where(self, f: Field) -> str:
        return f"{self.path}.{f.name}" if self.path else f.name

    def error(self, f: Field, expected: str, value: Any = ...) -> InputError:
        shown = "{...}" if isinstance(f.value, Message) else f.value
        return InputError(Problem(self.where(f), shown if value is ... else value, expected, f.line), self.source)

    def one(self, name: str) -> Field | None:
        found = self.msg.all(name)
        if len(found) > 1:
            raise self.error(found[1], f"one {name} (first given on line {found[0].line})", "<duplicate>")
        return found[0] if found else None

    def check_known(self, known: set[str]) -> None:
        """Every field not in ``known`` is unknown: refused (all of them together) or, with --ignore-unknown,
        left out and listed as ignored."""
        for f in self.msg.fields:
            if f.name not in known:
                shown = "{...}" if isinstance(f.value, Message) else f.value
                unknown_option(InputError(Problem(self.where(f), shown, f"a field batchcheck knows here: "
                                                  f"{', '.join(sorted(known))} (see docs/importers.md), or "
                                                  "--ignore-unknown", f.line), self.source),
                               f"{self.where(f)}={shown}")

    def int(self, name: str, default: int, minimum: int = 0) -> tuple[int, Field | None]:
        f = self.one(name)
        if f is None:
            return default, None
        if isinstance(f.value, bool) or not isinstance(f.value, int) or f.value < minimum:
            raise self.error(f, f"an integer >= {minimum}")
        return f.value, f

    def ints(self, name: str, minimum: int = 1) -> tuple[list[int], Field | None]:
        found = self.msg.all(name)
        values: list[int] = []
        for f in found:
            items = f.value if isinstance(f.value, list) else [f.value]
            for item in items:
                if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
                    raise self.error(f, f"integers >= {minimum}")
                values.append(item)
        return values, (found[0] if found else None)

    def bool(self, name: str) -> tuple[bool, Field | None]:
        f = self.one(name)
        if f is None:
            return False, None
        if not (isinstance(f.value, Ident) and f.value in ("true", "false")):
            raise self.error(f, "true or false")
        return f.value == "true", f

    def enum(self, name: str, choices: tuple[str, ...], default: str) -> tuple[str, Field | None]:
        f = self.one(name)
        if f is None:
            return default, None
        if not isinstance(f.value, str) or f.value not in choices:
            raise self.error(f, "one of: " + ", ".join(choices))
        return str(f.value), f

    def sub(self, name: str) -> _Cfg | None:
        f = self.one(name)
        if f is None:
            return None
        if not isinstance(f.value, Message):
            raise self.error(f, "a message { ... }")
        return _Cfg(f.value, self.where(f), self.source)


def import_triton(args: list[str], config: str | None) -> Draft:
    files: list[str] = []
    given = parse_cli(args, TABLE, positional=files.append)
    sources = ([config] if config else []) + files
    if len(sources) != 1:
        raise UsageError("give one Triton model configuration: batchcheck import triton CONFIG.pbtxt "
                         f"--max-model-len N (got {len(sources)} files)")
    source = sources[0]
    from checker.loading import read_text

    top = _Cfg(parse_pbtxt(read_text(source), source), "", source)
    draft = Draft(SYSTEM, "Triton Inference Server dynamic batcher (request-level batches)")
    mml_arg: Arg | None = given.take("max-model-len")
    if mml_arg is None:
        raise missing("--max-model-len", "the model's context length (config.pbtxt does not say; the policy model "
                      "rejects prompts of this length or more)")
    mml = mml_arg.value
    draft.set("max_model_len", mml, f"{mml_arg.shown} (not in config.pbtxt)")
    top.check_known(KNOWN)
    _refuse_other_schedulers(top)
    ignored = [n for n in top.msg.names() if n in NO_EFFECT]
    if ignored:
        draft.ignored.append(f"{', '.join(dict.fromkeys(ignored))} (no effect on scheduling)")
    _instances(top, draft)

    max_bs, bs_field = top.int("max_batch_size", 0)
    dyn = top.sub("dynamic_batching")
    if dyn is None:
        seqs = 1
        draft.assume("batch.max_num_seqs", 1, "no dynamic_batching: Triton's default scheduler runs one request at "
                     "a time per model instance")
    else:
        if max_bs < 1:
            raise top.error(bs_field, ">= 1 with dynamic_batching (Triton rejects dynamic batching without batching)",
                            max_bs) if bs_field is not None else \
                InputError(Problem("max_batch_size", "<missing>", ">= 1 with dynamic_batching", None), source)
        seqs = max_bs
        draft.set("batch.max_num_seqs", seqs, "max_batch_size")
        _dynamic(dyn, draft, max_bs)
    budget = seqs * mml
    if budget > MAX_TOKENS:
        draft.approximate("batch.max_num_batched_tokens", MAX_TOKENS, f"{seqs} x {mml} exceeds the policy model's "
                          "bound on a step budget")
        budget = MAX_TOKENS
    draft.assume("batch.max_num_batched_tokens", budget, "Triton batches whole requests: the step budget is "
                 "max_batch_size x max_model_len, so it never binds", "the whole batch's prompts in one pass")
    draft.set("batch.phase_mode", "static", "a batch runs until its longest request finishes")
    draft.set("chunking.enabled", False, "a request-level model takes the whole prompt")
    blocks = min(seqs * -(-mml // KV_BLOCK), MAX_BLOCKS)
    draft.assume("kv.num_blocks", blocks, f"Triton does not manage KV: a pool that holds a full batch of "
                 f"max_model_len requests in blocks of {KV_BLOCK}, so it never binds", "a full batch of max_model_len")
    draft.set("kv.block_size", KV_BLOCK)
    draft.set("kv.allocation", "full_reservation", "the model instance holds a request's memory until it ends")
    draft.set("queue.head_of_line", "strict", "batches are taken from the queue head")
    draft.set("preemption.triggers", [], "a batch is never interrupted")
    draft.set("cancellation.release_lag_steps", 0)
    draft.approximate("cancellation.release_lag_steps", 0, "Triton checks cancellation while a request is queued; "
                      "inside a running batch it is the backend's job. The policy model frees a cancelled running "
                      "request at once")
    given.check_all_taken()
    return draft


def _refuse_other_schedulers(top: _Cfg) -> None:
    for name, why in (("sequence_batching", "the sequence batcher (stateful sequences) is not modelled"),
                      ("ensemble_scheduling", "an ensemble pipeline of models is not modelled")):
        f = top.one(name)
        if f is not None:
            refuse_later(top.error(f, f"no {name}: {why}"))
    backend = top.one("backend")
    if backend is not None and str(backend.value) in ITERATION_BACKENDS:
        raise top.error(backend, f"a request-level backend: the {backend.value} backend batches iteration by "
                        f"iteration itself; import its engine configuration with `batchcheck import "
                        f"{ITERATION_BACKENDS[str(backend.value)]}`")
    policy = top.sub("model_transaction_policy")
    if policy is not None:
        policy.check_known({"decoupled"})
        decoupled, f = policy.bool("decoupled")
        if decoupled:
            raise policy.error(f, "false: a decoupled model batches inside its backend (iteration-level); import "
                               "the backend's engine configuration instead")  # type: ignore[arg-type]


def _instances(top: _Cfg, draft: Draft) -> None:
    groups = top.msg.all("instance_group")
    if not groups:
        draft.assume_input("instance_group", "one instance", "Triton creates one per available GPU; the policy model "
                           "is one instance running one batch at a time")
        return
    total = 0
    for group in groups:
        items = group.value if isinstance(group.value, list) else [group.value]
        for index, item in enumerate(items):
            if not isinstance(item, Message):
                raise top.error(group, "a list of { count: N kind: ... } messages")
            cfg = _Cfg(item, f"instance_group[{index}]", top.source)
            cfg.check_known({"name", "kind", "count", "gpus", "rate_limiter", "host_policy", "passive",
                             "secondary_devices", "profile"})
            count, count_field = cfg.int("count", 1, minimum=1)
            gpus, _ = cfg.ints("gpus", minimum=0)
            total += count * max(1, len(gpus))
            if total > 1:
                expected = ("one model instance in all: several instances run batches concurrently, which the "
                            "policy model (one batch at a time) cannot express")
                if count_field is not None:
                    raise cfg.error(count_field, expected)
                raise top.error(group, expected)


def _dynamic(dyn: _Cfg, draft: Draft, max_bs: int) -> None:
    dyn.check_known({"preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering", "priority_levels",
                     "default_priority_level", "default_queue_policy", "priority_queue_policy"})
    preferred, pf = dyn.ints("preferred_batch_size")
    if pf is not None and any(size != max_bs for size in preferred):
        raise dyn.error(pf, f"no preferred sizes other than max_batch_size={max_bs}: sending a smaller preferred "
                        "batch while more requests wait is not expressible", preferred if len(preferred) > 1
                        else preferred[0])
    if pf is not None:
        draft.ignored.append(f"dynamic_batching.preferred_batch_size={preferred} (equal to max_batch_size)")
    delay, df = dyn.int("max_queue_delay_microseconds", 0)
    if delay > 0:
        raise dyn.error(df, "0: waiting for a fuller batch before sending is not expressible")  # type: ignore[arg-type]
    if df is None:
        draft.assume_input("dynamic_batching.max_queue_delay_microseconds", 0, "Triton's default: a batch is sent "
                           "as soon as the instance is free")
    ordering, of = dyn.bool("preserve_ordering")
    if of is not None:
        draft.ignored.append(f"dynamic_batching.preserve_ordering={str(ordering).lower()} (orders responses only)")
    ppf = dyn.one("priority_queue_policy")
    if ppf is not None:
        raise dyn.error(ppf, "no per-level queue policy: the policy model has one queue policy for all levels")
    levels, lf = dyn.int("priority_levels", 0)
    default_level, dlf = dyn.int("default_priority_level", 0)
    if levels > 1:
        draft.set("queue.order", "priority", "dynamic_batching.priority_levels")
        draft.set("queue.priority_polarity", "lower_first", "Triton: level 1 is the highest")
        if default_level < 1 or default_level > levels:
            raise dyn.error(dlf, f"a level in 1..{levels}", default_level) if dlf is not None else \
                InputError(Problem(f"{dyn.path}.default_priority_level", "<missing>", f"a level in 1..{levels} "
                                   "with priority_levels", dyn.msg.line), dyn.source)
        draft.approximate("queue.priority_polarity", "lower_first", f"workload priorities are Triton levels (1 is the "
                          f"highest); Triton maps priority 0 to default_priority_level={default_level}, the policy "
                          "model ranks 0 above level 1: give workloads explicit levels")
    else:
        draft.set("queue.order", "fcfs", "one FIFO queue" if lf is None else "priority_levels <= 1: one level")
        if dlf is not None:
            draft.ignored.append(f"dynamic_batching.default_priority_level={default_level} (no priority levels)")
    policy = dyn.sub("default_queue_policy")
    if policy is not None:
        _queue_policy(policy, draft, levels)


def _queue_policy(policy: _Cfg, draft: Draft, levels: int) -> None:
    policy.check_known({"timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size"})
    action, af = policy.enum("timeout_action", ("REJECT", "DELAY"), "REJECT")
    if action == "DELAY":
        raise policy.error(af, "REJECT: DELAY moves a timed-out request behind the others (it may wait forever); "  # type: ignore[arg-type]
                           "the policy model only rejects timed-out requests")
    timeout, _ = policy.int("default_timeout_microseconds", 0)
    if timeout > 0:
        ms = -(-timeout // 1000)
        draft.set("timeouts.queue_timeout_ms", ms, "default_timeout_microseconds / 1000")
        draft.set("timeouts.action", "reject", "timeout_action REJECT" if af is not None else "assumed (default)")
        if af is None:
            draft.assume_input(f"{policy.path}.timeout_action", "REJECT", "Triton's default")
        if timeout % 1000:
            draft.approximate("timeouts.queue_timeout_ms", ms, f"{timeout} us rounded up to whole ms")
    override, of = policy.bool("allow_timeout_override")
    if of is not None:
        draft.ignored.append(f"{policy.path}.allow_timeout_override={str(override).lower()} (batchcheck workloads "
                             "set no per-request timeout)")
    size, sf = policy.int("max_queue_size", 0)
    if size > 0:
        if levels > 1:
            raise policy.error(sf, "0 with priority_levels: each level has its own queue of this size, the policy "  # type: ignore[arg-type]
                               "model one queue cap")
        draft.set("admission.max_queue_len", size, "max_queue_size: reject at enqueue when full")
