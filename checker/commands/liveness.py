"""The ``liveness`` verb: a thin shell over checker.api.run_liveness (docs/liveness.md)."""

from __future__ import annotations

import argparse
import json

from checker.commands.shell import SECONDS, STEP_MS, number, terminal_progress
from checker.liveness.canon import IDENTITY_TOKENS
from checker.liveness.explore import external_choice
from checker.liveness.lasso import ALL_PROPERTIES


def _ints(text: str) -> tuple[int, ...]:
    """1,2,4 or 1:4 (every value from 1 to 4) or a mix: 1:3,8."""
    values: list[int] = []
    try:
        for part in (p for p in text.split(",") if p):
            low, sep, high = part.partition(":")
            values += range(int(low), int(high) + 1) if sep else [int(low)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected integers like 16,48 or a range like 1:4)") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} (expected at least one integer)")
    return tuple(sorted(set(values)))


def _identities(text: str) -> tuple:
    """own,g0,g1,g0+1: prompt identities (checker.requests.IDENTITIES)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in IDENTITY_TOKENS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{unknown[0] if unknown else text!r} (expected prompt identities among "
                                         f"{', '.join(IDENTITY_TOKENS)}: own tokens, prefix group 0, prefix group 1, "
                                         f"group 0 from its second block)")
    return tuple(IDENTITY_TOKENS[n] for n in dict.fromkeys(names))


def _external(text: str) -> tuple[int, ...]:
    """none,block,all or token counts: the external hits of a KV connector's arrivals (LivenessEnv.external)."""
    try:
        values = tuple(dict.fromkeys(external_choice(p.strip()) for p in text.split(",") if p.strip()))
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} (expected external hits among none, block, all (the whole prompt) "
                                         "or token counts >= 0, e.g. none,block,all)")
    return values


def run(args: argparse.Namespace) -> int:
    """Explore, check and print (the liveness verb and ``verify --liveness``)."""
    from checker.api import run_liveness

    report = run_liveness(args.policy, args.property, args.requests, args.prompts, args.outputs, args.priorities,
                          args.tenants, args.cancellations, args.arrivals_per_step, args.step_ms, args.set,
                          args.max_states, args.timeout, args.out, terminal_progress(), args.jobs,
                          identities=args.identities, external=args.external, accepted=args.accepted)
    terminal_progress.clear()
    code = report.exit_code()
    if args.json:
        print(json.dumps({"policy_file": args.policy, **report.as_dict()}, indent=2))
        return code
    print(f"policy {args.policy}" + (f" with {', '.join(args.set)}" if args.set else "") + "; assumptions:")
    for line in report.env.describe():
        print(f"  - {line}")
    print(report.graph_line())
    for r in report.results:
        print(r.line(report.graph))
    if report.bound is not None:
        print(report.bound.line())
    return code


DESCRIPTION = ("Enumerate every reachable state of the policy with a bounded number of requests in flight and small "
               "sets of request classes (networkx graph, canonical states, symmetry reduction), then look for "
               "lassos: eventually_served, no_livelock, no_deadlock. Exit 1: a lasso was found (replayed on the "
               "engine and saved); 0: every property PROVED on the complete graph; 3: the graph was cut off by "
               "--max-states or --timeout (NO_COUNTEREXAMPLE). docs/liveness.md.")

# The options of the instance that only the liveness check reads (verify --liveness takes them too).
INSTANCE_OPTIONS = ("property", "prompts", "outputs", "priorities", "tenants", "cancellations", "arrivals_per_step",
                    "identities", "external", "accepted", "set", "max_states", "jobs")


def add_instance_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--property", action="append", choices=ALL_PROPERTIES, metavar="NAME",
                   help="eventually_served, no_livelock, no_deadlock or no_hold_and_wait (repeatable; default: the first "
                   "three, and no_hold_and_wait with a KV connector)")
    p.add_argument("--prompts", type=_ints, metavar="LIST", help="prompt lengths, e.g. 16,600 (default: one KV block; "
                   "two with prefix caching)")
    p.add_argument("--identities", type=_identities, metavar="LIST", help="prefix caching: the prompt identities a "
                   "request's prompt is drawn from, among own (its own tokens), g0, g1 (prefix groups 0 and 1) and "
                   "g0+1 (group 0 from its second block) (default g0: requests share their common prefix)")
    p.add_argument("--external", type=_external, metavar="LIST", help="a KV connector that loads: the external hits an "
                   "arrival may have, among none, block (its first KV block), all (its whole prompt) and token counts "
                   "(default none,block,all); load latencies come from connector.max_load_steps and "
                   "connector.transfers_may_hang")
    p.add_argument("--accepted", type=_ints, metavar="LIST", help="speculative decoding: how many drafts the verifier "
                   "may accept in a step, the environment's choice for each request verifying drafts, e.g. 0 (every "
                   "draft rejected: the worst case) or 0:2 (default 0..speculative.num_tokens)")
    p.add_argument("--outputs", type=_ints, default=(1, 2), metavar="LIST", help="output lengths (default 1:2)")
    p.add_argument("--priorities", type=_ints, metavar="LIST",
                   help="priorities (default 0,1 when the policy reads priorities, else 0)")
    p.add_argument("--tenants", type=number(int, 1, 64, unit="tenants"), default=1, metavar="N",
                   help="tenants (default 1)")
    p.add_argument("--cancellations", action="store_true", help="clients may cancel live requests (default: never)")
    p.add_argument("--arrivals-per-step", type=number(int, 1, 64), metavar="K", help="at most K arrivals per iteration "
                   "(default: as many as there are free places)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a policy field for this instance, e.g. batch.max_num_seqs=1 (repeatable)")
    p.add_argument("--max-states", type=number(int, 1, 100_000_000, unit="states"), metavar="N",
                   help="stop exploring after N states (default 200,000)")
    p.add_argument("--jobs", type=number(int, 1, 1024, unit="processes"), default=1, metavar="N",
                   help="explore with N worker processes (the same "
                   "graph; default 1)")


def register(verbs) -> None:
    p = verbs.add_parser(
        "liveness", help="explore a small instance's state graph for starvation, livelock and deadlock lassos",
        description=DESCRIPTION + " The same check runs as `verify --liveness`.")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("--requests", type=number(int, 1, 16, unit="requests"), default=2, metavar="N",
                   help="requests in the system at once (default 2)")
    add_instance_arguments(p)
    p.add_argument("--step-ms", type=STEP_MS, default=10.0, metavar="MS", help="clock: ms per iteration (default 10)")
    p.add_argument("--timeout", type=SECONDS, default=60.0, metavar="S", help="seconds for the exploration (default 60)")
    p.add_argument("--out", default="counterexamples", metavar="DIR", help="where lasso files go (default "
                   "counterexamples/)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)
