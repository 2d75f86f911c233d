#!/usr/bin/env bash
# The weight phase's guard against lucky guesses, measured (issue 26; whale.train.guesses).
#
#   bash experiments/whale/guess-guard.sh [RUN_ROOT]     (default ~/whale-runs/guess-guard)
#
# Weight-only cotrain of the 0.5B on rg:letter_counting, the family where an earlier run
# collapsed onto "2" (docs/commands/cotrain.md), with the same seeds, splits and budget: without
# a guard (the paper's S+: every accepted run), with rsft.guess_precision = 0.5 (guesses left
# out), with rsft.answer_prompts = 1 (an answer taught on one prompt per step), both, and with
# rsft.chance_guard (a step trained only when its samples beat their answers' chance rate).
# Weight steps of 0.2 epoch (8 prompts x G 4), as in that run. A run cut short is resumed.
# Then prints, per arm, each weight step (samples, accepted, left out as guesses, trained)
# and each eval read (accuracy, the most common answer's share). ~10-20 min per arm on 2 cores.
set -euo pipefail
root=${1:-$HOME/whale-runs/guess-guard}
whale=${WHALE:-whale}
mkdir -p "$root"
# arm: rsft.guess_precision, rsft.answer_prompts
declare -A guard=([off]="0.0 0 false" [guess]="0.5 0 false" [spread]="0.0 1 false"
                  [both]="0.5 1 false" [chance]="0.0 0 true")
arms=(off guess spread both chance)
for arm in "${arms[@]}"; do
  read -r share prompts luck <<< "${guard[$arm]}"
  out="$root/$arm"
  if [ -f "$out/summary.json" ]; then
    echo "$arm: finished ($out)"
    continue
  fi
  args=(--task rg:letter_counting --harness single_call --solver qwen-coder-0.5b
        --schedule weight-only --rollouts 64 --weight-epochs 0.4 --g 4 --train 40 --search 8
        --eval 40 --workers 2 --seed 0 --set rsft.step_epochs=0.2 --set solver.cache=false
        --set "rsft.guess_precision=$share" --set "rsft.answer_prompts=$prompts"
        --set "rsft.chance_guard=$luck")
  if [ -d "$out" ]; then
    "$whale" cotrain --resume "$out"
  else
    "$whale" cotrain "${args[@]}" --out "$out"
  fi
done
python - "$root" <<'PY'
import collections, json, sys
from pathlib import Path

root = Path(sys.argv[1])
for arm in ("off", "guess", "spread", "both", "chance"):
    d = root / arm / "weight-only"
    print(f"== {arm}: {root / arm}")
    for line in (d / "weight" / "steps.jsonl").read_text().splitlines():
        s = json.loads(line)
        print(f"  step {s['step']}: {s['samples']} samples, {s['accepted']} accepted, "
              f"{s.get('guessed', 0)} left out as guesses {s.get('guesses', {})}, "
              f"{sum(s.get('repeated', {}).values())} as repeats {s.get('repeated', {})}, "
              + (f"chance {s['chance']}, " if s.get("chance") else "")
              + f"{s['examples']} examples, trained {s['trained']}"
              + (f" ({s['skipped']})" if s.get("skipped") else ""))
    rows = collections.defaultdict(list)
    for line in (d / "outcomes.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "eval":
            rows[r["adapter"]].append(r)
    for read in json.loads((d / "summary.json").read_text())["reads"]:
        got = rows.get(read["adapter"], [])  # a read of unchanged weights is the ledger's
        answers = collections.Counter(" ".join(str(r["answer"]).split()).casefold()
                                      for r in got if r["answer"] is not None)
        top, k = answers.most_common(1)[0] if answers else ("-", 0)
        print(f"  eval read at {read['training_rollouts']} rollouts (adapter {read['adapter']}): "
              f"accuracy {read['accuracy']:.3f} of {read['n']}; {len(answers)} distinct "
              f"answers, the most common {top!r} on {k}/{len(got)}")
PY
