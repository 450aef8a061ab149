"""batchcheck verify on policies with prefix caching (explicit-state search on the engine): verdict lines,
exit codes, counterexample files."""

from __future__ import annotations

import json

from checker.cli import main
from tests.helpers import POLICIES

CACHING = POLICIES / "prefix_caching" / "vllm_v1.yaml"
UNCOUNTED = POLICIES / "broken" / "vllm_v1_cache_uncounted_hits.yaml"
UNCHAINED = POLICIES / "broken" / "vllm_v1_cache_unchained_hashes.yaml"
DOMAINS = ("explicit-state search on the engine: prompts {16 (1 block), 17 (1 block + 1 token), 32 (2 blocks), "
           "128 (fills the pool with 2 requests), 255 (the pool less 1 token), 257 (the pool + 1 token)} tokens, "
           "outputs {1, 2, 8} tokens, declared max output = output, prompt identities {own tokens, prefix group 0, "
           "prefix group 1, prefix group 0 from its second block}, priorities {0}, 1 tenant(s); identities and "
           "output lengths chosen when the step first reads them; ")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.split(" ", 1)[0] in
            ("VIOLATED", "HOLDS_UP_TO", "VACUOUS", "UNKNOWN", "PROVED")]


def small_pool(tmp_path):
    path = tmp_path / "cache_small.yaml"
    path.write_text(CACHING.read_text().replace("num_blocks: 2500", "num_blocks: 8").replace("block_size: 16",
                                                                                          "block_size: 4"))
    return path


def test_the_uncounted_hits_over_commit_is_violated_and_replays(capsys, tmp_path):
    code, out, err = run(capsys, "verify", str(UNCOUNTED), "--invariant", "kv_never_overcommitted", "--requests", "2",
                         "--depth", "4", "--out", str(tmp_path))
    assert code == 1, err
    assert "  - explicit-state search on the engine (the step itself, breadth-first, equal states merged, block pool " \
           "content included): prompts {16 (1 block)," in out
    (line,) = verdicts(out)
    assert line.startswith("VIOLATED     kv_never_overcommitted                   1 request(s), fails at iteration 3; "
                           "minimal: no violation with fewer requests up to depth 4, none shorter with 1 (" + DOMAINS)
    (path,) = tmp_path.glob("vllm_v1_cache_uncounted_hits__kv_never_overcommitted__*.json")
    assert f"replayed on the engine: {path}  [" in line
    code, out, _ = run(capsys, "replay", str(path))
    assert code == 1
    assert out.splitlines()[-1] == "kv_never_overcommitted VIOLATED at iteration 3 (recorded: iteration 3)"
    assert "17/16" in out.splitlines()[-2]  # iteration 3: the re-admission over-commits the pool by one block


def test_the_unchained_wrong_hit_is_violated_with_the_prompt_identities(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(UNCHAINED), "--invariant", "hit_only_on_identical_chain", "--requests",
                       "2", "--depth", "4", "--out", str(tmp_path))
    assert code == 1
    (line,) = verdicts(out)
    assert line.startswith("VIOLATED     hit_only_on_identical_chain              2 request(s), fails at iteration 0; "
                           "minimal: no violation with fewer requests up to depth 4, none shorter with 2 (" + DOMAINS)
    (path,) = tmp_path.glob("vllm_v1_cache_unchained_hashes__hit_only_on_identical_chain__*.json")
    doc = json.loads(path.read_text())
    assert [row["prompt_runs"] for row in doc["requests"]] == [[[0, 32]], [[16, 17]]]
    code, out, _ = run(capsys, "replay", str(path))
    assert code == 1
    assert out.splitlines()[-1] == "hit_only_on_identical_chain VIOLATED at iteration 0 (recorded: iteration 0)"


def test_holds_up_to_names_the_method_and_the_domains_and_unbounded_proves_nothing(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(small_pool(tmp_path)), "--invariant", "token_budget", "--invariant",
                       "seq_cap", "--requests", "1", "--depth", "3", "--out", str(tmp_path))
    assert code == 0
    lines = verdicts(out)
    assert [line.split()[:2] for line in lines] == [["HOLDS_UP_TO", "token_budget"], ["HOLDS_UP_TO", "seq_cap"]]
    for line in lines:
        assert "1 requests, 3 iterations (bounded check, not a proof; explicit-state search on the engine: " \
               "prompts {4 (1 block), 5 (1 block + 1 token), 8 (2 blocks), 31 (the pool less 1 token), 32 (fills " \
               "the pool with 1 request), 33 (the pool + 1 token)} tokens, outputs {1, 2, 6} tokens" in line
    assert "safe" not in out.lower()

    code, out, _ = run(capsys, "verify", str(small_pool(tmp_path)), "--invariant", "token_budget", "--requests", "1",
                       "--depth", "3", "--unbounded", "--out", str(tmp_path))
    assert code == 0
    (line,) = verdicts(out)
    assert line.startswith("HOLDS_UP_TO  token_budget")
    assert "; --unbounded: no proof method covers the prefix cache yet (the z3 encoding and the induction do not " \
           "model block identity), so this stays a bounded check  [" in line
    assert "PROVED" not in out


def test_vacuous_and_unknown_exit_3(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(CACHING), "--invariant", "kv_never_overcommitted", "--requests", "1",
                       "--depth", "2", "--out", str(tmp_path))
    assert code == 3
    (line,) = verdicts(out)
    assert line.startswith("VACUOUS      kv_never_overcommitted                   its situation never occurs within 1 "
                           "requests, 2 iterations (explicit-state search on the engine: prompts {16 (1 block), ")
    assert line.split("  [")[0].endswith("), so nothing was checked")

    code, out, _ = run(capsys, "verify", str(small_pool(tmp_path)), "--invariant", "seq_cap", "--requests", "3",
                       "--depth", "6", "--timeout", "0.5", "--out", str(tmp_path))
    assert code == 3
    (line,) = verdicts(out)
    assert line.startswith("UNKNOWN      seq_cap                                  timeout; no violation with ")


def test_json_names_the_method(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(small_pool(tmp_path)), "--invariant", "token_budget", "--requests", "1",
                       "--depth", "2", "--json", "--out", str(tmp_path))
    assert code == 0
    doc = json.loads(out)
    assert doc["environment"]["method"] == "explicit-state search on the engine"
    assert doc["environment"]["prompt_choices"] == [4, 5, 8, 31, 32, 33]
    (result,) = doc["results"]
    assert result["verdict"] == "HOLDS_UP_TO" and result["method"] == "explicit-state search on the engine"
    assert result["states"] > 0


def test_a_policy_without_caching_keeps_the_z3_verdict_line(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", str(POLICIES / "vllm_v1.yaml"), "--invariant", "token_budget", "--requests",
                       "1", "--depth", "2", "--bounded-only", "--out", str(tmp_path))
    assert code == 0
    assert "  - 1 request slots, 2 iterations of 10 ms each; a slot arrives at any iteration (or never), slots in " \
           "arrival order" in out
    (line,) = verdicts(out)
    assert line.split("  [")[0] == ("HOLDS_UP_TO  token_budget                             1 requests, 2 iterations "
                                    "(bounded check, not a proof)")
    assert "explicit-state" not in out
