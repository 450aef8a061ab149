#!/usr/bin/env bash
# Installable anywhere (issue 22): build the sdist and the wheel with `python -m build`, install the wheel in a
# fresh venv (its dependencies from the package index), and run every verb from a folder outside this
# repository, naming the shipped examples by name (they ship inside the wheel: checker/examples.py). The
# sdist is built into a wheel too, so that it holds everything a build needs. .ci/run calls this after the
# tests; run it by hand as `bash .ci/wheel_check.sh`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip build
"$py" -m build -q --outdir "$work/dist" "$root" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$py" -m pip wheel -q --no-deps -w "$work/from-sdist" "$work"/dist/batchcheck-*.tar.gz
"$py" -m pip install -q "$work"/dist/batchcheck-*.whl
bc="$work/venv/bin/batchcheck"
cd "$work"  # outside the repository: only the installed package
expect() {  # expect CODE COMMAND...: run a verb, fail unless it exits CODE
  local want=$1; shift
  set +e; "$@" > out.txt 2>&1; local got=$?; set -e
  if [ "$got" != "$want" ]; then
    echo "wheel check: '$*' exited $got (expected $want):"; tail -20 out.txt; exit 1
  fi
  echo "ok ($got): ${*#$bc }"
}
expect 0 "$bc" --version
expect 0 "$bc" schema --kind policy
expect 0 "$bc" simulate vllm_v1 --workload chat_mixed
expect 0 "$bc" validate vllm_v1 chat_mixed
expect 0 "$bc" import vllm --out imported.yaml -- --max-num-seqs 64 --max-model-len 8192 --num-gpu-blocks-override 2000
expect 0 "$bc" verify vllm_v1 --invariant token_budget --requests 1 --depth 2 --out cex
expect 0 "$bc" verify vllm_v1 --invariant token_budget --requests 2 --depth 2 --unbounded --proof-dir proofs --out cex
cert=$(ls proofs/* | head -1)
expect 0 "$bc" recheck "$cert"
expect 1 "$bc" verify broken/unchecked_growth --invariant kv_never_overcommitted --requests 2 --depth 2 --out cex
found=$(ls cex/*.json | head -1)
expect 1 "$bc" replay "$found"
expect 0 "$bc" report "$found" --out reports
expect 1 "$bc" fuzz vllm_v1 --workload chat_mixed --max-examples 3 --time-budget 20 --database none --out fuzzed
expect 1 "$bc" liveness strict_priority --set batch.max_num_seqs=1 --out lassos
expect 0 "$bc" audit --policy vllm_v1 --workload chat_mixed
expect 0 "$bc" diff vllm_v1 vllm_v1 --invariant token_budget --requests 1 --depth 1
"$py" - <<'PY'
import json
from checker.checklog import engine_log, load_arrivals
from checker.examples import resolve
from checker.inputfiles import load_policy
rows = [{"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 20},
        {"id": "b", "arrival_step": 3, "prompt_tokens": 60, "output_tokens": 10}]
open("arrivals.json", "w").write(json.dumps(rows))
lines = engine_log(load_policy(resolve("vllm_v1", "policy")), load_arrivals("arrivals.json"), 40)
open("log.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
expect 0 "$bc" check-log vllm_v1 log.jsonl --arrivals arrivals.json --conformance
printf '%s\n' '# scrape 1' 'vllm:num_requests_running{engine="0"} 3' 'vllm:num_requests_waiting{engine="0"} 1' \
  '# scrape 2' 'vllm:num_requests_running{engine="0"} 5' 'vllm:num_requests_waiting{engine="0"} 0' > scrapes.prom
expect 0 "$bc" check-metrics vllm_v1 scrapes.prom
mkdir -p team/policies && cp imported.yaml team/policies/prod.yaml
printf '%s\n' 'policies = ["policies/*.yaml"]' '[defaults]' 'requests = 1' 'depth = 1' '[[verify]]' \
  'invariants = ["token_budget"]' > team/batchcheck.toml
(cd team && expect 0 "$bc" ci --jobs 1)
expect 0 "$bc" calibrate fit "$("$py" -c 'from checker.examples import examples_root; print(examples_root())')/profiles/measurements/cpu-small-llama.csv" --out fitted.json
echo "wheel check: every verb ran from the installed wheel ($(ls "$work"/dist | tr '\n' ' '))"
