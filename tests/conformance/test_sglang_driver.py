"""Facts of SGLang 0.5.23's real scheduler, pinned on small traces driven through tests/sglang_driver.py.

Each test names the code it pins (paths inside the venv's site-packages/sglang/srt/); docs/sglang-harness.md
has the rules at length. Skipped, with the reason, when the SGLang venv is absent (tools/sglang_setup.sh builds
it; BATCHCHECK_SGLANG_VENV points at another): CI does not build it. All scenarios run in one driver process
(SGLang's import is most of the ~30 s).
"""

from __future__ import annotations

import math

import pytest

from tests import sglang_harness as harness

pytestmark = pytest.mark.skipif(harness.venv_python() is None, reason=harness.absent_reason())

# name -> (trace rows, driver flags)
SCENARIOS = {
    # one request, 100-token prompt, 30 outputs, 16-token pages, a 512-token pool, no chunking
    "page": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 30}],
             ["--pool-tokens", "512", "--page-size", "16", "--chunked-prefill-size", "-1"]),
    # the new-token ratio with init 0.5, min factor 0.2 (min 0.1), 10 decay steps (0.04 a step)
    "ratio": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 10, "output_tokens": 20}],
              ["--pool-tokens", "512", "--init-new-token-ratio", "0.5", "--min-new-token-ratio-factor", "0.2",
               "--new-token-ratio-decay-steps", "10"]),
    # the defaults: SGLANG_INIT_NEW_TOKEN_RATIO 0.7, factor 0.14, 600 steps
    "ratio_default": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 10, "output_tokens": 8}],
                      ["--pool-tokens", "512"]),
    # two requests admitted together (the clip keeps the reservation small), then decode runs out of pool
    "retract": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 80, "output_tokens": 100},
                 {"id": "b", "arrival_step": 0, "prompt_tokens": 60, "output_tokens": 100}],
                ["--pool-tokens", "300", "--disable-radix-cache", "--clip-max-new-tokens", "10"]),
    # b arrives later, so it has fewer outputs when the pool runs out
    "retract_fewest_outputs": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 60, "output_tokens": 100},
                                {"id": "b", "arrival_step": 3, "prompt_tokens": 80, "output_tokens": 100}],
                               ["--pool-tokens", "300", "--disable-radix-cache", "--clip-max-new-tokens", "10"]),
    # a lone request that outgrows the pool: nobody left to retract
    "last_request": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 50, "output_tokens": 100}],
                     ["--pool-tokens", "64", "--disable-radix-cache", "--clip-max-new-tokens", "5"]),
    # a 300-token prompt under a 128-token chunk: the chunked request goes first, 128 at a time
    "chunks": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 300, "output_tokens": 3},
                {"id": "b", "arrival_step": 1, "prompt_tokens": 40, "output_tokens": 3}],
               ["--pool-tokens", "1024", "--chunked-prefill-size", "128"]),
    # b is aborted while waiting, a while it is the chunked request, c while it decodes
    "aborts": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 300, "output_tokens": 3, "abort_step": 1},
                {"id": "b", "arrival_step": 0, "prompt_tokens": 40, "output_tokens": 3, "abort_step": 0},
                {"id": "c", "arrival_step": 1, "prompt_tokens": 40, "output_tokens": 5, "abort_step": 3}],
               ["--pool-tokens", "1024", "--chunked-prefill-size", "128"]),
    # two low-priority requests fill the two running slots; a high-priority one arrives
    "priority": ([{"id": "lo1", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 50, "priority": 0},
                  {"id": "lo2", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 50, "priority": 0},
                  {"id": "hi", "arrival_step": 5, "prompt_tokens": 100, "output_tokens": 10, "priority": 20}],
                 ["--pool-tokens", "1024", "--max-running-requests", "2", "--enable-priority-scheduling"]),
    # a running request decodes inside the prefill batch of a later one
    "mixed": ([{"id": "a", "arrival_step": 0, "prompt_tokens": 30, "output_tokens": 10},
               {"id": "b", "arrival_step": 2, "prompt_tokens": 200, "output_tokens": 4}],
              ["--pool-tokens", "1024", "--chunked-prefill-size", "128", "--enable-mixed-chunk"]),
}


def _lpm_rows(unique: int) -> list[dict]:
    """r0 (prefix group 0) fills the tree; at step 5, `unique` unrelated requests and then y (group 0) wait."""
    rows = [{"id": "r0", "arrival_step": 0, "prompt_tokens": 300, "output_tokens": 1, "prefix_group": 0}]
    rows += [{"id": f"u{i}", "arrival_step": 5, "prompt_tokens": 10, "output_tokens": 1} for i in range(unique)]
    rows.append({"id": "y", "arrival_step": 5, "prompt_tokens": 250, "output_tokens": 1, "prefix_group": 0})
    return rows


ONE_AT_A_TIME = ["--pool-tokens", "4096", "--max-running-requests", "1"]
ONE = [{"id": "a", "arrival_step": 0, "prompt_tokens": 20, "output_tokens": 3}]
SCENARIOS.update({
    "lpm": (_lpm_rows(2), ONE_AT_A_TIME + ["--schedule-policy", "lpm"]),
    "fcfs": (_lpm_rows(2), ONE_AT_A_TIME + ["--schedule-policy", "fcfs"]),
    "lpm_128": (_lpm_rows(127), ONE_AT_A_TIME + ["--schedule-policy", "lpm"]),  # 128 waiting: still LPM
    "lpm_129": (_lpm_rows(128), ONE_AT_A_TIME + ["--schedule-policy", "lpm"]),  # 129 waiting: FCFS
    "lpm_no_cache": (_lpm_rows(2), ONE_AT_A_TIME + ["--schedule-policy", "lpm", "--disable-radix-cache"]),
    "normal_loop": (ONE, ["--pool-tokens", "256"]),
    "overlap_loop": (ONE, ["--pool-tokens", "256", "--overlap"]),
})


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sglang")
    jobs = []
    for name, (rows, flags) in SCENARIOS.items():
        jobs.append((harness.write_trace(folder / f"{name}.trace.json", rows), flags, folder / f"{name}.log.jsonl"))
    summaries = harness.drive(jobs, timeout=600)
    out = {}
    for (name, _), (_, _, log), summary in zip(SCENARIOS.items(), jobs, summaries):
        out[name] = (harness.read_log(log), summary)
    return out


def decode_steps(steps):
    return [s for s in steps if s["kind"] == "decode"]


def test_every_scenario_runs_to_completion(logs):
    for name, (steps, summary) in logs.items():
        assert summary["done"] == summary["requests"], name
        assert steps, name


def test_allocation_is_page_granular_and_the_tree_keeps_whole_pages(logs):
    # allocator/paged.py alloc_extend / alloc_decode: a request holds ceil(kv_len / page) pages; a decode step
    # takes a new page only when kv_committed_len % page_size == 0 (ScheduleBatch.new_tokens_required_next_decode).
    # The radix tree inserts page-aligned keys only, so the tree holds floor(kv_len / page) pages.
    steps, _ = logs["page"]
    pool, page, prompt = 512, 16, 100
    first = steps[0]
    assert first["kind"] == "prefill" and first["scheduled"] == {"a": 100}
    assert first["available_tokens"] == pool - page * math.ceil(prompt / page)  # 400: 7 pages for 100 tokens
    assert first["protected_tokens"] == page * (prompt // page)  # 96: the partial 7th page is not in the tree
    for d, s in enumerate(decode_steps(steps), start=1):
        kv_len = prompt + d  # each decode step writes the KV of the token sampled the step before
        if s["finished"]:
            # release_kv_cache: the tree keeps the whole pages (evictable now), the partial page is freed
            assert s["evictable_tokens"] == page * (kv_len // page)
            assert s["available_tokens"] + s["evictable_tokens"] == pool and s["protected_tokens"] == 0
        else:
            assert s["available_tokens"] == pool - page * math.ceil(kv_len / page), s
    # the 13th decode step (kv 113) is the first to take an 8th page
    assert [s["available_tokens"] for s in decode_steps(steps)[11:13]] == [400, 384]


def test_the_new_token_ratio_decays_linearly_per_decode_step_to_its_floor(logs):
    # scheduler_components/new_token_ratio_tracker.py: init = min(SGLANG_INIT_NEW_TOKEN_RATIO *
    # schedule_conservativeness, 1), min = min(init * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1),
    # decay = (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS; decay_step: max(current - decay, min), called by
    # Scheduler.update_running_batch when check_decode_mem passes. A prefill step does not decay it.
    steps, _ = logs["ratio"]
    assert steps[0]["kind"] == "prefill" and steps[0]["new_token_ratio"] == 0.5
    for d, s in enumerate(decode_steps(steps), start=1):
        assert s["new_token_ratio"] == pytest.approx(max(0.5 - 0.04 * d, 0.1), abs=1e-9), s
    assert decode_steps(steps)[-1]["new_token_ratio"] == pytest.approx(0.1)


def test_the_default_ratio_parameters(logs):
    steps, _ = logs["ratio_default"]
    init, floor = 0.7, 0.7 * 0.14
    decay = (init - floor) / 600
    assert steps[0]["new_token_ratio"] == pytest.approx(init)
    for d, s in enumerate(decode_steps(steps), start=1):
        assert s["new_token_ratio"] == pytest.approx(init - decay * d, abs=1e-9)


def _retraction(steps):
    hits = [(i, s) for i, s in enumerate(steps) if s["retracted"]]
    assert len(hits) == 1, [s["step"] for _, s in hits]
    return hits[0]


def test_retraction_picks_the_longest_prompt_among_equal_outputs_and_frees_its_whole_kv(logs):
    # ScheduleBatch._get_decode_retraction_order: indices sorted by (len(output_ids), -len(origin_input_ids)),
    # descending; retract_decode pops from the end: fewest outputs first, then the longest prompt.
    steps, _ = logs["retract"]
    assert steps[0]["scheduled"] == {"a": 80, "b": 60}  # both admitted at once (clipped reservations)
    i, s = _retraction(steps)
    assert s["retracted"] == ["a"] and s["kind"] == "decode" and s["scheduled"] == {"b": 1}
    assert s["running"] == 1 and s["waiting"] == 1
    prev = steps[i - 1]
    outputs = prev["step"] + 1  # one from the prefill at step 0, one a decode step after it
    kv_a = 80 + outputs - 1  # a's KV: the prompt and every output but the last (not yet written)
    # release_req -> release_kv_cache(checkpoint=False): all of a's KV goes back; b then takes one slot
    assert s["available_tokens"] == prev["available_tokens"] + kv_a - 1
    # NewTokenRatioTracker.estimate_new_token_ratio_after_retract over the requests left (b):
    # min(1, (decoded + SGLANG_RETRACT_DECODE_STEPS * n) / (sum max_new_tokens + 1))
    assert s["new_token_ratio"] == pytest.approx(min(1.0, (outputs + 20 * 1) / (100 + 1)))
    # a comes back through the waiting queue: it prefills its prompt and the outputs it kept
    again = next(t for t in steps[i + 1:] if "a" in t["scheduled"])
    assert again["kind"] == "prefill" and again["scheduled"]["a"] == 80 + outputs


def test_retraction_picks_the_request_with_fewest_outputs_first(logs):
    steps, _ = logs["retract_fewest_outputs"]
    _, s = _retraction(steps)
    assert s["retracted"] == ["b"]  # b (later, fewer outputs) goes, though its prompt is the longer one


def test_the_last_running_request_is_aborted_when_even_it_does_not_fit(logs):
    # retract_decode keeps at least one request; if that one still fails check_decode_mem it is aborted
    # ("Out of memory even after retracting all other requests", FINISH_ABORT) and its KV freed.
    steps, _ = logs["last_request"]
    end = [s for s in steps if s["aborted"]]
    assert len(end) == 1 and end[0]["aborted"] == ["a"] and not end[0]["retracted"]
    assert end[0]["kind"] == "idle" and end[0]["available_tokens"] == 64
    # it had filled the pool: 64 tokens of KV when the next decode needed a 65th
    before = steps[steps.index(end[0]) - 1]
    assert before["available_tokens"] == 0


def test_the_chunked_request_is_continued_first_and_page_sized_chunks_fill_the_budget(logs):
    # _get_new_batch_prefill_raw: adder.add_chunked_req(self.chunked_req) runs before the waiting queue; the
    # chunk budget left after it (rem_chunk_tokens) admits the next request.
    steps, _ = logs["chunks"]
    assert [s["scheduled"] for s in steps[:3]] == [{"a": 128}, {"a": 128}, {"a": 44, "b": 40}]
    assert [s["chunked"] for s in steps[:3]] == ["a", "a", None]


def test_aborts_while_waiting_while_chunked_and_while_decoding(logs):
    # Scheduler.abort_request: a waiting request leaves the queue at once; the chunked request is only marked
    # (_pending_chunked_abort_req) and torn down by process_pending_chunked_abort at the top of the next
    # get_next_batch_to_run, its KV freed; a running request gets to_finish = FINISH_ABORT, still runs that
    # step's forward, and finishes (aborted) when its result is processed.
    steps, _ = logs["aborts"]
    assert [(s["scheduled"], s["aborted"]) for s in steps] == [
        ({"a": 128}, ["b"]), ({"c": 40}, ["a"]), ({"c": 1}, []), ({"c": 1}, ["c"])]
    assert steps[1]["available_tokens"] == 1024 - 40  # a's 128-token chunk went back to the pool
    last = steps[-1]
    assert last["available_tokens"] + last["evictable_tokens"] + last["protected_tokens"] == 1024


def test_priority_preemption_evicts_the_lowest_priority_latest_running_request(logs):
    # PrefillAdder.preempt_to_schedule (on by default with --enable-priority-scheduling): running requests sorted
    # by (priority * -priority_sign, -wait_queue_entry_time), preempted while the priority gap exceeds
    # --priority-scheduling-preemption-threshold (10) until the candidate's tokens fit; preempted requests are
    # released (their cached prefix stays in the tree, now evictable) and re-queued.
    steps, _ = logs["priority"]
    s = steps[5]
    assert s["preempted"] == ["lo2"] and s["scheduled"] == {"hi": 100} and s["waiting"] == 1
    assert s["evictable_tokens"] == 100  # lo2's prompt, unlocked in the tree
    assert steps[6]["scheduled"] == {"lo1": 1, "hi": 1}
    assert sum(len(t["preempted"]) for t in steps) == 1


def test_a_mixed_step_carries_one_decode_token_per_running_request(logs):
    # _get_new_batch_prefill_raw with --enable-mixed-chunk: the PrefillAdder's budgets start lowered by the
    # running batch size (num_mixed_decode_tokens), then mix_with_running merges the decode rows into the batch.
    steps, _ = logs["mixed"]
    mixed = [s for s in steps if s["kind"] == "mixed"]
    assert mixed and mixed[0]["step"] == 2
    assert mixed[0]["scheduled"] == {"b": 127, "a": 1}  # the 128-token chunk less one row for a's decode
    assert all(s["kind"] != "prefill" for s in steps[1:])


def test_the_pool_identity_holds_on_every_step(logs):
    # available + evictable + protected + held == total, held being the requests' own KV
    # ([cache_protected_len, kv_allocated_len) in whole pages, ReqKvInfo); nothing is held once nothing runs.
    for name, (steps, summary) in logs.items():
        for s in steps:
            total = s["available_tokens"] + s["evictable_tokens"] + s["protected_tokens"] + s["held_tokens"]
            assert total == summary["total_tokens"], (name, s)
        last = steps[-1]
        if last["running"] == 0 and last["chunked"] is None:
            assert last["held_tokens"] == 0, name


def _first_after_arrival(steps):
    return next(s["scheduled"] for s in steps if s["step"] >= 5 and s["scheduled"])


def test_lpm_takes_the_longest_cached_prefix_first_and_matches_at_most_len_minus_one(logs):
    # SchedulePolicy._sort_by_longest_prefix: -num_matched_prefix_tokens; y matches 249 of its 250 tokens
    # (Req._compute_max_prefix_len: input_len - 1), so its prefill extends 1 token.
    assert _first_after_arrival(logs["lpm"][0]) == {"y": 1}
    assert _first_after_arrival(logs["fcfs"][0]) == {"u0": 10}


def test_lpm_falls_back_to_fcfs_above_128_waiting_and_without_the_cache(logs):
    # _determine_active_policy: lpm with more than WAITING_QUEUE_PREFIX_MATCH_MAX (128) waiting -> FCFS;
    # _validate_and_adjust_policy: a cache-aware policy with the radix cache disabled -> FCFS.
    assert _first_after_arrival(logs["lpm_128"][0]) == {"y": 1}
    assert _first_after_arrival(logs["lpm_129"][0]) == {"u0": 10}
    assert _first_after_arrival(logs["lpm_no_cache"][0]) == {"u0": 10}


def test_the_overlap_loop_processes_each_result_one_iteration_late_and_skips_the_finishing_decode(logs):
    # event_loop_overlap: batch k's result is processed after batch k+1 is scheduled. The prefill's checkpoint
    # into the tree therefore lands a step late, and _reqs_finishing_inflight keeps a request whose queued
    # result reaches max_new_tokens out of the next decode batch (no wasted decode).
    normal, _ = logs["normal_loop"]
    overlap, _ = logs["overlap_loop"]
    assert [(s["kind"], s["finished"]) for s in normal] == [("prefill", []), ("decode", []), ("decode", ["a"])]
    assert [(s["kind"], s["finished"]) for s in overlap] == [
        ("prefill", []), ("decode", []), ("decode", []), ("idle", ["a"])]
    assert (normal[0]["protected_tokens"], normal[0]["held_tokens"]) == (20, 0)
    assert (overlap[0]["protected_tokens"], overlap[0]["held_tokens"]) == (0, 20)
