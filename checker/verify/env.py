"""The environment model: what the solver may choose, stated explicitly and printed with every verdict.

N request slots within a depth of K iterations. Slot i arrives at iteration ``arrival_step`` in
[0, K] (K: it never arrives within the horizon, so N slots cover every smaller number of requests),
slots are numbered in arrival order (symmetry breaking, and the encoder's assumption), its prompt and
output lengths lie in declared ranges, its declared max output lies between its output length and a
cap, its priority and tenant come from declared sets, and (if allowed) the client cancels it at some
iteration at or after its arrival. The clock is fixed: iteration k starts at k * step_us.

With a KV connector (policy.connector) the environment also chooses, per slot, the tokens the external tier
holds (0, or any prefix of the prompt up to all of it) and the transfer latencies: a load takes 1 ..
connector.max_load_steps steps, a prefill node's send is confirmed 1 .. max_load_steps steps after the finish
(send_steps 0 .. max_load_steps - 1), and either never completes if connector.transfers_may_hang.

kv_never_overcommitted's situation is the pool filling up, which N requests of the environment cannot reach when
N times the most blocks one request holds is less than the pool (``pool_fill``); verify --unbounded then checks it
in a derived environment with more slots and (where the output domain is the default) longer outputs
(``pool_fill_environment``; docs/invariants.md, "An environment that can fill the KV pool").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from checker.errors import InputError, Problem
from checker.policy import Policy
from checker.requests import RequestSpec
from checker.smt.encode import SlotParams
from checker.smt.ops import SmtSession, Term
from checker.workload import Workload

DEFAULT_STEP_US = 10_000
# Blocked waiting states: the longest grammar compile (iterations) verify's environment chooses (0..this)
MAX_GRAMMAR_STEPS = 2


@dataclass(frozen=True)
class Environment:
    requests: int
    depth: int
    prompt: tuple[int, int]
    output: tuple[int, int]
    max_output_cap: int
    priorities: tuple[int, ...] = (0,)
    tenants: int = 1
    cancellations: bool = True
    step_us: int = DEFAULT_STEP_US
    # A KV connector (policy.connector), 0 without one: the longest transfer in steps, and whether one may hang
    max_load_steps: int = 0
    transfers_may_hang: bool = False
    loads: bool = False  # requests may load external KV (offload, decode_node, both)
    sends: bool = False  # finished requests wait for their send (prefill_node, both)
    # Derived to fill the KV pool (pool_fill_environment): the blocks its engine probes try to hold at once (the
    # pool less the invariant's headroom); 0 for an environment as given
    fill_blocks: int = 0
    # Speculative decoding (policy.speculative), 0 without it: the verifier accepts 0..max_accepted of the drafts
    # scheduled for each request, chosen per request and iteration
    max_accepted: int = 0
    # Blocked waiting states (policy.queue.blocked_waiting), 0 without them: a request's grammar compiles for
    # 0..max_grammar_steps iterations after its arrival (RequestSpec.grammar_steps), chosen per request
    max_grammar_steps: int = 0

    def describe(self) -> list[str]:
        return [
            f"{self.requests} request slots, {self.depth} iterations of {self.step_us / 1000:g} ms each; "
            f"a slot arrives at any iteration (or never), slots in arrival order",
            f"prompt tokens in [{self.prompt[0]}, {self.prompt[1]}], output tokens in "
            f"[{self.output[0]}, {self.output[1]}], declared max output in [output, {self.max_output_cap}]",
            f"priorities in {{{', '.join(map(str, self.priorities))}}}, {self.tenants} tenant(s); "
            + ("a client may cancel at any iteration after arrival" if self.cancellations else "no cancellations"),
        ] + self.describe_connector() + ([
            f"speculative decoding: the verifier accepts any 0..{self.max_accepted} of the drafts scheduled for a "
            "request, chosen per request and iteration"] if self.max_accepted else []) + ([
            f"blocked waiting states: a request's grammar compiles for 0..{self.max_grammar_steps} iteration(s) after "
            "its arrival (grammar_steps, chosen per request)"] if self.max_grammar_steps else [])

    def describe_connector(self) -> list[str]:
        if not self.max_load_steps:
            return []
        what = [w for w, on in (("a load (external tokens: 0 or any prefix of the prompt)", self.loads),
                                ("a send after the finish", self.sends)) if on]
        return [f"KV connector: {' and '.join(what) or 'no transfer'} takes 1..{self.max_load_steps} iteration(s)"
                + (", or never completes" if self.transfers_may_hang else "")]

    def as_dict(self) -> dict:
        return {"requests": self.requests, "depth": self.depth, "prompt_tokens": list(self.prompt),
                "output_tokens": list(self.output), "max_output_cap": self.max_output_cap,
                "priorities": list(self.priorities), "tenants": self.tenants,
                "cancellations": self.cancellations, "step_us": self.step_us,
                **({"connector": {"max_load_steps": self.max_load_steps, "transfers_may_hang": self.transfers_may_hang,
                                  "loads": self.loads, "sends": self.sends}} if self.max_load_steps else {}),
                **({"fill_blocks": self.fill_blocks} if self.fill_blocks else {}),
                **({"speculative": {"accepted": [0, self.max_accepted]}} if self.max_accepted else {}),
                **({"grammar_steps": [0, self.max_grammar_steps]} if self.max_grammar_steps else {})}


# The most request slots a derived pool-filling environment may have: the action-wise proof's cost grows with N
# (about 3 s at 3 slots, 20 s at 5, 40 s at 8 on this project's loaded 2-core machine; docs/invariants.md)
MAX_FILL_REQUESTS = 12
# Slots tried beyond the least number that can hold the pool, while no engine probe fills it
FILL_EXTRA_REQUESTS = 3
# Blocks of decode growth per request beyond its share of the watermark that the pool-filling outputs allow for
FILL_GROWTH_BLOCKS = 8


@dataclass(frozen=True)
class PoolFill:
    """Can N requests of an environment hold the whole KV pool at once (kv_never_overcommitted's situation)?
    A request holds at most the blocks of its longest context: prompt + declared max output (+ a drafter's
    lookahead slots), capped at max_model_len (checker/semantics/kv.py); N requests hold at most N times that."""

    requests: int
    blocks: int  # blocks that must be held at once: the pool less the invariant's headroom
    per_request: int  # the most blocks one request of the environment can hold
    why_per_request: str

    @property
    def least(self) -> int:
        """The fewest requests that can hold ``blocks``."""
        return max(1, -(-self.blocks // self.per_request))

    @property
    def can_fill(self) -> bool:
        return self.requests * self.per_request >= self.blocks

    def shortfall(self) -> str:
        """Why the environment's requests cannot fill the pool."""
        return (f"{self.requests} request(s) hold at most {self.requests * self.per_request:,} of the "
                f"{self.blocks:,} blocks that fill the pool ({self.per_request:,} each: {self.why_per_request})")


def pool_fill(policy: Policy, env: Environment, headroom: int = 0) -> PoolFill:
    kv = policy.kv
    spec = policy.speculative
    lookahead = spec.lookahead_slots if spec.enabled else 0
    tokens = min(policy.max_model_len, env.prompt[1] + env.max_output_cap + lookahead)
    bound = (f"prompt + max output {'+ lookahead ' if lookahead else ''}<= {tokens:,} tokens"
             + (" (max_model_len)" if tokens == policy.max_model_len else "") + f", block_size {kv.block_size}")
    return PoolFill(env.requests, max(0, kv.num_blocks - headroom), max(1, -(-tokens // kv.block_size)), bound)


def fill_outputs(policy: Policy, requests: int) -> int:
    """Output tokens long enough for the first of ``requests`` long prompts to still run when the last one's
    prefill is done (the pool's tokens at the step's token budget), and then to grow each request by a few
    blocks more than its share of the admission watermark (a pool is filled by decode growth beyond it)."""
    kv = policy.kv
    prefill_steps = -(-kv.num_blocks * kv.block_size // policy.batch.max_num_batched_tokens) + requests
    return prefill_steps + (-(-kv.watermark_blocks // requests) + FILL_GROWTH_BLOCKS + 2) * kv.block_size


def pool_fill_environment(policy: Policy, env: Environment, headroom: int, outputs_free: bool,
                          fills: Callable[[Environment], bool]) -> tuple[Environment, str] | None:
    """For the KV invariant, an environment whose requests fill the pool: where ``env``'s N cannot hold it, the
    least number of slots that can (more, up to FILL_EXTRA_REQUESTS, while no engine probe fills it: ``fills``);
    where it can but no probe of ``env`` fills it, the same N. Where the output domain is the default one
    (``outputs_free``), outputs long enough to keep the first requests running while the last are prefilled.
    Returns (environment, the abstraction stated with the verdict), or None when ``env`` is kept: no number of slots
    up to MAX_FILL_REQUESTS can hold the pool, or N can and nothing would change (outputs fixed by the user, or no
    probe of a derived environment fills the pool either). The derived environment covers every behaviour of
    ``env`` (slots may arrive late or never; the output domain only grows), so its verdict is one on ``env`` too."""
    need = pool_fill(policy, env, headroom)
    if need.least > MAX_FILL_REQUESTS or (need.can_fill and not outputs_free):
        return None
    least = env.requests if need.can_fill else need.least
    first = None
    for n in range(least, min(MAX_FILL_REQUESTS, least + FILL_EXTRA_REQUESTS) + 1):
        hi_o = max(env.output[1], fill_outputs(policy, n)) if outputs_free else env.output[1]
        raised = replace(env, requests=n, output=(env.output[0], hi_o), max_output_cap=max(env.max_output_cap, hi_o),
                         fill_blocks=need.blocks)
        first = first or raised
        if fills(raised):
            break
    else:
        if need.can_fill:
            return None
        raised = first
    outputs = (f"outputs up to {raised.output[1]:,} tokens (was {env.output[1]:,}), so the first requests still run "
               "when the last are prefilled" if raised.output != env.output else "")
    if need.can_fill:
        changed = [f"N raised from {env.requests} to {raised.requests}"] if raised.requests != env.requests else []
        if raised.output != env.output:
            changed.append(f"outputs from {env.output[1]:,} to {raised.output[1]:,} tokens")
        return raised, (f"{' and '.join(changed) or 'pool-filling probes'} for this invariant: no engine probe of "
                        f"{env.requests} requests with outputs up to {env.output[1]:,} tokens fills the {need.blocks:,} "
                        "blocks" + (" (the first requests finish before the last are prefilled)"
                                    if raised.output != env.output else ""))
    return raised, (f"N raised from {env.requests} to {raised.requests} for this invariant: {need.shortfall()}"
                    + (f"; {outputs}" if outputs else ""))


def default_environment(policy: Policy, requests: int, depth: int, workload: Workload | None = None,
                        prompt: tuple[int, int] | None = None, output: tuple[int, int] | None = None,
                        cancellations: bool = True, step_us: int = DEFAULT_STEP_US) -> Environment:
    """Ranges from flags, else from a workload's classes, else from the policy (any prompt up to
    max_model_len, outputs up to twice the depth)."""
    if workload is not None:
        lo_p = min(_low(c.prompt_tokens) for c in workload.classes)
        hi_p = max(c.prompt_tokens.upper for c in workload.classes)
        lo_o = min(_low(c.output_tokens) for c in workload.classes)
        hi_o = max(c.output_tokens.upper for c in workload.classes)
        cap = max(c.max_output for c in workload.classes)
        priorities = tuple(sorted({c.priority for c in workload.classes}))
        tenants = len(workload.tenants)
        cancellations = cancellations and any(c.cancel is not None for c in workload.classes)
    else:
        lo_p, hi_p = 1, policy.max_model_len
        lo_o, hi_o = 1, max(2, 2 * depth)
        cap, priorities, tenants = hi_o, (0, 1), 2
    lo_p, hi_p = prompt or (lo_p, hi_p)
    lo_o, hi_o = output or (lo_o, hi_o)
    for name, (lo, hi) in (("--prompt-range", (lo_p, hi_p)), ("--output-range", (lo_o, hi_o))):
        if not 1 <= lo <= hi:
            raise InputError(Problem(name, f"{lo}:{hi}", "LOW:HIGH with 1 <= LOW <= HIGH"))
    if requests < 1 or depth < 1:
        raise InputError(Problem("--requests/--depth", f"{requests}/{depth}", "both >= 1"))
    con = policy.connector
    transfers = {} if not con.enabled else {
        "max_load_steps": con.max_load_steps, "transfers_may_hang": con.transfers_may_hang,
        "loads": con.loads, "sends": con.pins}
    spec = policy.speculative
    return Environment(requests, depth, (lo_p, hi_p), (lo_o, hi_o), max(cap, hi_o), priorities, tenants,
                       cancellations, step_us, **transfers, max_accepted=spec.num_tokens if spec.enabled else 0,
                       max_grammar_steps=MAX_GRAMMAR_STEPS if policy.queue.blocked_waiting != "off" else 0)


def _low(dist) -> int:
    return getattr(dist, "low", None) or getattr(dist, "min", None) or getattr(dist, "value", None) or min(dist.values)


@dataclass
class SymbolicRequests:
    """The solver's choices for N slots, and the constraints that keep them inside the environment."""

    arrival_step: list[Term]
    cancel_step: list[Term]
    params: list[SlotParams]
    constraints: list[Term]

    def cancels_at(self, o, k: int) -> list[Term]:
        return [c == k for c in self.cancel_step]


def symbolic_requests(smt: SmtSession, o, env: Environment, n: int, tag: str = "") -> SymbolicRequests:
    arrival, cancel, params, cons = [], [], [], []
    for i in range(n):
        a = smt.int_var(f"{tag}arrival_step_{i}")
        c = smt.int_var(f"{tag}cancel_step_{i}")
        prompt = smt.int_var(f"{tag}prompt_{i}")
        output = smt.int_var(f"{tag}output_{i}")
        max_out = smt.int_var(f"{tag}max_output_{i}")
        prio = smt.int_var(f"{tag}priority_{i}")
        tenant = smt.int_var(f"{tag}tenant_{i}")
        cons += [a >= 0, a <= env.depth,
                 prompt >= env.prompt[0], prompt <= env.prompt[1],
                 output >= env.output[0], output <= env.output[1],
                 max_out >= output, max_out <= env.max_output_cap,
                 o.or_(*(prio == p for p in env.priorities)),
                 tenant >= 0, tenant < env.tenants]
        if env.cancellations:
            cons.append(o.or_(c == -1, o.and_(c >= a, c < env.depth)))
        else:
            cons.append(c == -1)
        if i:
            cons.append(arrival[-1] <= a)
        arrival.append(a)
        cancel.append(c)
        transfer = _transfer_choices(smt, o, env, f"{tag}", i, prompt, cons)
        if env.max_grammar_steps:  # blocked waiting states: the grammar's compile time
            g = smt.int_var(f"{tag}grammar_steps_{i}")
            cons += [g >= 0, g <= env.max_grammar_steps]
            transfer["grammar_steps"] = g
        params.append(SlotParams(a * env.step_us, prompt, output, max_out, prio, tenant, **transfer))
    return SymbolicRequests(arrival, cancel, params, cons)


def _transfer_choices(smt: SmtSession, o, env: Environment, tag: str, i: int, prompt: Term,
                      cons: list[Term]) -> dict[str, Term]:
    """A KV connector's per-slot choices (none without one: the SlotParams defaults, never read)."""
    if not env.max_load_steps:
        return {}
    out: dict[str, Term] = {}
    hang = [-1] if env.transfers_may_hang else []
    if env.loads:
        ext, steps = smt.int_var(f"{tag}external_tokens_{i}"), smt.int_var(f"{tag}load_steps_{i}")
        cons += [ext >= 0, ext <= prompt,
                 o.or_(o.and_(steps >= 1, steps <= env.max_load_steps), *(steps == h for h in hang))]
        out.update(external_tokens=ext, load_steps=steps)
    if env.sends:
        send = smt.int_var(f"{tag}send_steps_{i}")
        cons.append(o.or_(o.and_(send >= 0, send < env.max_load_steps), *(send == h for h in hang)))
        out["send_steps"] = send
    return out


def concrete_requests(smt: SmtSession, sym: SymbolicRequests, env: Environment, horizon: int) -> list[RequestSpec]:
    """The solver's model as requests; slots that arrive after the horizon are left out (they are the
    last ones, so request numbers stay the same)."""
    specs = []
    for i, prm in enumerate(sym.params):
        a = smt.value(sym.arrival_step[i])
        if a >= horizon:
            break
        c = smt.value(sym.cancel_step[i])
        transfer = {}
        if env.max_load_steps:  # a KV connector's choices (-1: never)
            load, send = smt.value(prm.load_steps), smt.value(prm.send_steps)
            transfer = {"external_tokens": smt.value(prm.external_tokens), "load_steps": None if load < 0 else load,
                        "send_steps": None if send < 0 else send}
        if env.max_grammar_steps:
            transfer["grammar_steps"] = smt.value(prm.grammar_steps)
        specs.append(RequestSpec(
            rid=i, arrival_us=a * env.step_us, prompt_len=smt.value(prm.prompt_len),
            output_len=smt.value(prm.output_len), max_output=smt.value(prm.max_output),
            priority=smt.value(prm.priority), tenant=smt.value(prm.tenant), cls=0,
            cancel_us=None if c < 0 else c * env.step_us, **transfer))
    return specs
