#!/usr/bin/env bash
# The framework examples end to end, on the embedded models: each harness evaluated and improved
# by `whale adapt`, then the Agents SDK harness as the harness of a short `whale cotrain`
# (weight-only: its own trajectories train the solver). Each step resumes where a run
# directory is already there, so a second start pays for nothing twice.
#     bash examples/frameworks/run.sh [OUT]        # OUT defaults to runs/frameworks
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/frameworks}
CONFIG=examples/frameworks/whale.toml
WHALE=${WHALE:-.venv/bin/whale}
mkdir -p "$OUT"

step() {  # step DIR COMMAND ARGS...: resume DIR if it holds a run, else start it there
    local dir=$1 cmd=$2
    shift 2
    if [ -f "$dir/config.toml" ]; then
        "$WHALE" "$cmd" --resume "$dir" --json
    else
        "$WHALE" "$cmd" --config "$CONFIG" --out "$dir" --json "$@"
    fi
}

for h in openai_client agents_sdk; do
    step "$OUT/adapt-$h" adapt --harness "examples/frameworks/$h.py" \
        --solver qwen-coder-0.5b --proposer qwen-coder-1.5b \
        --rounds 2 --g 2 --dev 20 --eval 40 --feedback 4
done
# The cotrain solver is the 1.5B: under the 0.5B the SDK agent had no accepted rollout to train
# on (0 of 10 on a selection pool of task seed 1000; the rule is in README.md).
step "$OUT/cotrain-agents_sdk-1.5b" cotrain --harness examples/frameworks/agents_sdk.py \
    --solver qwen-coder-1.5b --schedule weight-only --rollouts 16 --g 4 \
    --train 48 --eval 40 --validation 0
