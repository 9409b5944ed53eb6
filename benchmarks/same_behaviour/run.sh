#!/bin/bash
# The runs a refactor must leave unchanged, on one commit: `run.sh <commit> <out_dir>`.
# Two commits' outputs are then compared by `python compare.py <out_a> <out_b>`.
# Runs (tiny_chain_sum, the cached warm-up): 8 synchronous steps with validation every 4 and a checkpoint every 4;
# the same with async_training.max_staleness=1; dapo eval of the embedded model on GSM8K (16 problems x 4) and on
# 48 held-out chain_sum problems x 4; 2 ranks (torchrun underneath); SIGKILL after step 5 and --resume.
# About 4 minutes on 2 cores once the warm-up is cached. Needs the repo's .venv and ../shared/data.
set -u
C=$1; O=$(realpath -m "$2")
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
PY=$REPO/.venv/bin/python
WT=$(mktemp -d /tmp/same-behaviour-wt.XXXX)
if [ -e "$O" ] && [ -n "$(ls -A "$O")" ] && [ ! -f "$O/.same_behaviour" ]; then
  echo "$O is not empty and not an earlier run.sh output: refusing to replace it"; exit 1
fi
rm -rf "$O"; mkdir -p "$O"; touch "$O/.same_behaviour"
git -C "$REPO" worktree add --detach "$WT" "$C" >/dev/null 2>&1 || { echo "no commit $C"; exit 1; }
trap 'git -C "$REPO" worktree remove --force "$WT"' EXIT
cd "$WT"
export PYTHONPATH=$WT/src PATH=$REPO/.venv/bin:$PATH
DAPO="$PY -m dapo_rl.cli"
common="trainer.total_training_steps=8 trainer.test_freq=4 data.val_reasoning_gym.size=300"
$PY - "$O/chain_sum.jsonl" <<'PYEOF'
import json, sys
from dapo_rl.data import reasoning_gym_samples
s = reasoning_gym_samples("chain_sum", 48, 7000000, {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}, True)
with open(sys.argv[1], "w") as f:
    for x in s:
        f.write(json.dumps({"problem": x.prompt[-1]["content"], "answer": x.ground_truth}) + "\n")
PYEOF
step() { echo "$1 $(date +%T)" >> "$O/log"; shift; "$@"; echo "rc $?" >> "$O/log"; }
step sync $DAPO train tiny_chain_sum $common trainer.save_freq=4 trainer.output_dir="$O/sync" > "$O/sync.out" 2>&1
step async $DAPO train tiny_chain_sum $common trainer.save_freq=-1 async_training.max_staleness=1 trainer.output_dir="$O/async" > "$O/async.out" 2>&1
step eval $DAPO eval --data "$REPO/../shared/data/gsm8k/test.jsonl" --limit 16 --n 4 --max-tokens 24 --output "$O/eval" > "$O/eval.out" 2>&1
step eval2 $DAPO eval --data "$O/chain_sum.jsonl" --n 4 --max-tokens 48 --output "$O/eval2" > "$O/eval2.out" 2>&1
step ranks2 $DAPO train tiny_chain_sum $common trainer.save_freq=-1 trainer.nproc_per_node=2 trainer.output_dir="$O/ranks2" > "$O/ranks2.out" 2>&1
echo "kill $(date +%T)" >> "$O/log"
$DAPO train tiny_chain_sum $common trainer.save_freq=4 trainer.output_dir="$O/kill" > "$O/kill.out" 2>&1 &
P=$!
while ! grep -q '"step": 5' "$O/kill/metrics.jsonl" 2>/dev/null; do sleep 0.5; kill -0 $P 2>/dev/null || break; done
kill -9 $P; wait $P; echo "killed after $(wc -l < "$O/kill/metrics.jsonl") rows" >> "$O/log"
step resume $DAPO train tiny_chain_sum $common trainer.save_freq=4 trainer.output_dir="$O/kill" --resume > "$O/resume.out" 2>&1
echo "done $(date +%T)" >> "$O/log"
