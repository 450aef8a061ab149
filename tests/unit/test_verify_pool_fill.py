"""kv_never_overcommitted is checked where N requests can fill the KV pool (issue 19 item 3;
docs/invariants.md, "An environment that can fill the KV pool").

Today's code (before the derivation) gave VACUOUS for vllm_v1 at 2 requests: two prompts of at most 1,024 blocks
cannot fill 2,500. Each test below names the behaviour it pins; the z3 ones run the real action-wise proof."""

from __future__ import annotations

import json
import re
from glob import glob
from pathlib import Path

import jsonschema
import pytest

from checker.inputfiles import load_policy
from checker.verify.env import MAX_FILL_REQUESTS, default_environment, pool_fill, pool_fill_environment
from checker.verify.replay import replay_fixed_clock
from checker.verify.run import Verdict, check_one, run_verify
from checker.verify.vacuity import _fill_probes, engine_witness
from invariants.catalogue import CATALOGUE

KV = CATALOGUE["kv_never_overcommitted"]
VLLM = "spec/policies/vllm_v1.yaml"
SHIPPED = sorted(glob("spec/policies/*.yaml"))
SHORTFALL = ("2 request(s) hold at most 2,048 of the 2,500 blocks that fill the pool (1,024 each: prompt + max "
             "output <= 16,384 tokens (max_model_len), block_size 16)")


def _line(checked, proof_dir=None) -> str:
    """The verdict line without its seconds (and with the certificate's folder left out)."""
    line = re.sub(r"  \[\d+\.\d+ s\]$", "", checked.line())
    return line.replace(f"{proof_dir}/", "") if proof_dir is not None else line


def test_pool_fill_arithmetic():
    pol = load_policy(VLLM)
    two = pool_fill(pol, default_environment(pol, 2, 2))
    assert (two.per_request, two.blocks, two.least, two.can_fill) == (1024, 2500, 3, False)
    assert two.shortfall() == SHORTFALL
    assert pool_fill(pol, default_environment(pol, 3, 2)).can_fill
    # headroom: the pool less it must be held (kv_never_overcommitted:headroom=H's situation)
    assert pool_fill(pol, default_environment(pol, 2, 2), headroom=500).can_fill
    # a prompt domain of at most 512 tokens: 33 blocks a request (512 + 4 outputs), 76 requests needed
    short = pool_fill(pol, default_environment(pol, 2, 2, prompt=(1, 512)))
    assert (short.per_request, short.least) == (33, 76)


@pytest.mark.parametrize("path", SHIPPED)
def test_derived_environment_fills_every_shipped_pool(path):
    """On every shipped policy, at the repository's ci bounds (2 requests, 2 iterations), the derived environment
    raises N to the least that can hold the pool, and one of its probes, replayed here on the engine, holds every
    block of the pool at some iteration (not taken from engine_witness's own answer)."""
    pol = load_policy(path)
    env = default_environment(pol, 2, 2)
    need = pool_fill(pol, env)
    assert not need.can_fill
    wider, why = pool_fill_environment(pol, env, 0, True, lambda e: engine_witness(pol, KV, {}, e) is not None)
    assert wider.requests == need.least and wider.fill_blocks == pol.kv.num_blocks
    assert why.startswith(f"N raised from 2 to {need.least} for this invariant: {need.shortfall()}")
    full = [max(f.kv_used for f in replay_fixed_clock(pol, specs, 256, wider.step_us, wider.tenants).frames)
            for specs in _fill_probes(pol, wider)]
    assert pol.kv.num_blocks in full  # never more: the invariant holds on the probes too
    assert max(full) == pol.kv.num_blocks


def test_user_output_domain_is_kept():
    """An output domain the user gave (--output-range, a workload) is not raised: only N is."""
    pol = load_policy(VLLM)
    env = default_environment(pol, 2, 2, output=(1, 4))
    wider, why = pool_fill_environment(pol, env, 0, False, lambda e: True)
    assert (wider.requests, wider.output, wider.max_output_cap) == (3, (1, 4), 4)
    assert why == f"N raised from 2 to 3 for this invariant: {SHORTFALL}"


def test_no_fill_probes_in_a_given_environment():
    """Off means unchanged: an environment as given has no pool-filling probes (the same probes as before)."""
    pol = load_policy(VLLM)
    assert _fill_probes(pol, default_environment(pol, 3, 2)) == []


def test_ci_bounds_prove_kv_on_the_real_pool_word_for_word(tmp_path):
    """vllm_v1 at the ci's bounds: PROVED for 3 slots, with the pool shown to fill and the abstraction stated
    (today: VACUOUS, 'its situation never occurs within 2 requests, 2 iterations')."""
    env, (checked,) = run_verify(VLLM, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=120,
                                 unbounded=True, out_dir=tmp_path / "cx", proof_dir=tmp_path)
    assert env.requests == 2  # the environment printed at the top is the one given
    assert checked.verdict is Verdict.PROVED and checked.env.requests == 3
    assert _line(checked, tmp_path) == (
        "PROVED       kv_never_overcommitted                   for 3 request slots and any number of iterations "
        "(action-wise induction: core candidates; 7 step-boundary lemmas, 83 mid-step lemmas over 5 actions); its "
        "situation occurs at iteration 7 of an engine run (3 requests arriving at once, prompts of 13311-13326 "
        "tokens); certificate: vllm_v1__kv_never_overcommitted__N3.smt2; N raised from 2 to 3 for this invariant: "
        f"{SHORTFALL}; outputs up to 168 tokens (was 4), so the first requests still run when the last are "
        "prefilled")
    assert checked.as_dict()["abstraction"].startswith("N raised from 2 to 3")
    schema = json.loads(Path("docs/schemas/verify.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate({"policy": VLLM, "environment": env.as_dict(), "assumptions": env.describe(),
                         "results": [checked.as_dict()]}, schema)


def test_bounded_vacuous_says_why_and_what_to_change(tmp_path):
    """Without --unbounded (--bounded-only) the environment is kept; the VACUOUS line says why (its situation never
    occurs at any depth: N requests cannot hold the pool, by arithmetic, decided without a solver and so the same on
    every run) and what to change."""
    _, (checked,) = run_verify(VLLM, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=60,
                               out_dir=tmp_path / "cx", proof_dir=tmp_path)
    assert checked.verdict is Verdict.VACUOUS and checked.env.requests == 2 and checked.never_occurs
    assert _line(checked) == (
        "VACUOUS      kv_never_overcommitted                   its situation never occurs with 2 requests, at any "
        "depth (arithmetic: 2 x 1,024 blocks < 2,500), so nothing was checked; "
        f"{SHORTFALL}: the proof (the default; not with --bounded-only) checks it with N raised to 3")


def test_beyond_the_slot_limit_vacuous_names_the_number(tmp_path):
    """A pool that more than MAX_FILL_REQUESTS requests are needed to fill: the environment is kept and the line
    names how many would be needed."""
    _, (checked,) = run_verify(VLLM, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=60,
                               prompt=(1, 512), out_dir=tmp_path / "cx", proof_dir=tmp_path)
    assert checked.verdict is Verdict.VACUOUS and checked.env.requests == 2
    assert checked.abstraction == (
        "2 request(s) hold at most 66 of the 2,500 blocks that fill the pool (33 each: prompt + max output <= 516 "
        f"tokens, block_size 16): 76 requests could fill it, more than the {MAX_FILL_REQUESTS} slots verify raises N to "
        "(the proof's cost grows with N): --requests 76 checks it, slowly, or a longer --prompt-range")


def test_a_pool_small_n_fills_is_checked_as_before(tmp_path):
    """Off means unchanged: where the environment's N can hold the pool, the verdict is check_one's, line for
    line (a 64-block vllm_v1: two requests of up to 1,024 blocks hold it)."""
    pol = load_policy(VLLM)
    small = pol.model_copy(update={"kv": pol.kv.model_copy(update={"num_blocks": 64})})
    env, (checked,) = run_verify(small, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=60,
                                 out_dir=tmp_path / "a", proof_dir=tmp_path)
    before = check_one(small, None, KV, {}, env, 60, tmp_path / "b", False, tmp_path, None)
    assert checked.abstraction == "" and checked.env == env
    assert _line(checked).replace(str(tmp_path / "a"), "") == _line(before).replace(str(tmp_path / "b"), "")


def test_default_bounds_raise_outputs_where_no_probe_fills_the_pool(tmp_path):
    """verify's defaults (3 requests, 5 iterations: outputs up to 10 tokens): 3 requests can hold vllm_v1's pool, but
    the first finish before the last are prefilled, so no probe fills it (today: PROVED, 'whether its situation can
    occur was not decided'); the outputs are raised for this invariant and a probe shows the pool fills."""
    env, (checked,) = run_verify(VLLM, ["kv_never_overcommitted"], requests=3, depth=5, timeout_s=120,
                                 unbounded=True, out_dir=tmp_path / "cx", proof_dir=tmp_path)
    assert checked.verdict is Verdict.PROVED and checked.env.requests == 3 and checked.env.output == (1, 168)
    assert "its situation occurs at iteration 7 of an engine run (3 requests arriving at once" in checked.line()
    assert checked.abstraction == (
        "outputs from 10 to 168 tokens for this invariant: no engine probe of 3 requests with outputs up to 10 tokens "
        "fills the 2,500 blocks (the first requests finish before the last are prefilled)")
    # an output domain the user fixed is kept: the verdict is check_one's on the given environment
    fixed = pool_fill_environment(load_policy(VLLM), default_environment(load_policy(VLLM), 3, 5, output=(1, 10)),
                                  0, False, lambda e: True)
    assert fixed is None


def test_beyond_the_slot_limit_the_proof_is_for_any_n(tmp_path):
    """Issue 19 item 3 (an imported production pool that more than MAX_FILL_REQUESTS requests fill): verify's
    default (the proof) is not VACUOUS there but PROVED for any N where the any-N method covers the policy, with an
    engine probe that fills the real pool; --bounded-only keeps the arithmetic VACUOUS above."""
    _, (checked,) = run_verify(VLLM, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=120,
                               prompt=(1, 512), out_dir=tmp_path / "cx", proof_dir=tmp_path, unbounded=True)
    assert checked.verdict is Verdict.PROVED and checked.any_n, checked.line()
    assert checked.abstraction.endswith(
        f"76 requests could fill it, more than the {MAX_FILL_REQUESTS} slots verify raises N to, so it was proved for "
        "any N (--any-n)")
    assert checked.notes[0].startswith("its situation occurs at iteration")
    assert (tmp_path / "vllm_v1__kv_never_overcommitted__anyN.smt2").exists()


def test_an_imported_production_pool_is_filled_by_the_probe(tmp_path):
    """Issue 19 item 3 on the import a new user makes (vLLM on an 80 GiB GPU: 29,490 blocks of 16, 58 requests of
    nearly max_model_len tokens fill it): the PROVED for any N comes with an engine probe that fills the real pool.
    The pool's remainder over 58 requests put on the last one would need a prompt beyond max_model_len (534 blocks),
    so the probe spreads it one block each over the first requests (it said "may be vacuous" before)."""
    from checker.cli import main

    imported = tmp_path / "vllm_80g.yaml"
    assert main(["import", "vllm", "--model", "x", "--max-model-len", "8192", "--gpu-memory-gib", "80",
                 "--model-weights-gib", "16", "--kv-bytes-per-token", "131072", "--no-enable-prefix-caching",
                 "--out", str(imported)]) == 0
    _, (checked,) = run_verify(imported, ["kv_never_overcommitted"], requests=2, depth=2, timeout_s=120,
                               out_dir=tmp_path / "cx", proof_dir=tmp_path, unbounded=True)
    assert checked.verdict is Verdict.PROVED and checked.any_n, checked.line()
    assert checked.notes[0] == ("its situation occurs at iteration 85 of an engine run (58 requests arriving at once, "
                                "prompts of 8064-8080 tokens)"), checked.notes
