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
# the config's counterexample folder (as ci finds the config); empty when there is none (ci then says why)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
folder=$(python3 "$here/inputs.py" "${INPUT_CONFIG:-}" 2>/dev/null)
# changed-since: ci --base selects the checks of the policy files changed since the ref (every check when the
# config itself changed) and runs the base diffs ([[diff]] entries without old/new) against it
[ -n "${INPUT_CHANGED_SINCE:-}" ] && args+=(--base "$INPUT_CHANGED_SINCE")
batchcheck "${args[@]}" "${policies[@]}" 2> >(tee "$out/stderr.txt" >&2)
code=$?
wait  # the tee

if [ ! -s "$summary" ]; then  # bad config or input (exit 2) or a crash: say why
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
