#!/usr/bin/env bash
# The reusable action's main step (action.yml): run `batchcheck ci`, write its reports into $INPUT_OUTPUT_DIR,
# the summary into the job summary, and the step's outputs. It never fails itself: the action's last step
# exits with batchcheck's code, so the uploads run first. Inputs come as environment variables (INPUT_CONFIG,
# INPUT_POLICIES, INPUT_CHANGED_SINCE, INPUT_JOBS, INPUT_OUTPUT_DIR); outside GitHub, GITHUB_OUTPUT and
# GITHUB_STEP_SUMMARY default to files in the output folder.
set -uo pipefail
out="${INPUT_OUTPUT_DIR:-.batchcheck/action}"
mkdir -p "$out"
outputs="${GITHUB_OUTPUT:-$out/outputs.txt}"
job_summary="${GITHUB_STEP_SUMMARY:-$out/job-summary.md}"
sarif="$out/batchcheck.sarif"
summary="$out/summary.md"
rm -f "$sarif" "$summary" "$out/junit.xml"

args=(ci --junit "$out/junit.xml" --sarif "$sarif" --summary "$summary")
[ -n "${INPUT_CONFIG:-}" ] && args+=(--config "$INPUT_CONFIG")
[ -n "${INPUT_JOBS:-}" ] && args+=(--jobs "$INPUT_JOBS")
policies=()
if [ -n "${INPUT_POLICIES:-}" ]; then
  read -r -a policies <<< "$INPUT_POLICIES"
fi
# the config (as ci finds it) and its counterexample folder; empty when there is none (ci then says why)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
{ read -r config; read -r folder; } < <(python3 "$here/inputs.py" config "${INPUT_CONFIG:-}" 2>/dev/null)
run=1
if [ -n "${INPUT_CHANGED_SINCE:-}" ]; then
  if ! changed=$(git diff --name-only --diff-filter=AMR "$INPUT_CHANGED_SINCE...HEAD" 2>"$out/git.err"); then
    { echo "batchcheck: error: changed-since='$INPUT_CHANGED_SINCE' (expected a git ref of this checkout:"
      echo "$(head -1 "$out/git.err")); check out with fetch-depth: 0"; } > "$out/stderr.txt"
    code=2; run=0
  elif [ -z "${config:-}" ] || ! grep -qxF "$(realpath --relative-to="$(git rev-parse --show-toplevel)" "$config")" <<< "$changed"; then
    while IFS= read -r f; do  # the changed files that are policies (not workflows or workloads)
      policies+=("$f")
    done < <(python3 "$here/inputs.py" policies <<< "$changed" 2>/dev/null)
    if [ ${#policies[@]} -eq 0 ]; then
      echo "batchcheck: no policy file changed since $INPUT_CHANGED_SINCE: nothing to check" > "$out/stderr.txt"
      code=0; run=0
    fi
  fi  # the config itself changed: every check runs
fi
if [ $run -eq 1 ]; then
  batchcheck "${args[@]}" "${policies[@]}" 2> >(tee "$out/stderr.txt" >&2)
  code=$?
  wait  # the tee
fi

if [ ! -s "$summary" ]; then  # bad config or input (exit 2), a crash, or nothing to check: say why
  {
    echo "## batchcheck: exit $code"
    echo
    echo '```'
    cat "$out/stderr.txt" 2>/dev/null
    echo '```'
  } > "$summary"
fi
cat "$summary" >> "$job_summary"

cex=""
if [ -n "${folder:-}" ] && [ -d "$folder" ] && [ -n "$(ls -A "$folder" 2>/dev/null)" ]; then
  cex="$folder"
fi
{
  echo "exit-code=$code"
  if [ -s "$sarif" ]; then echo "sarif=$sarif"; else echo "sarif="; fi
  echo "summary=$summary"
  echo "counterexamples=$cex"
} >> "$outputs"
exit 0
