#!/bin/bash
# Asynchronous DAPO with the tool (issue 44): `run.sh <out_dir>` on this checkout.
# tiny_python_tool (its cached warm-up; built first if missing) with async_training.max_staleness=1, 6 steps of
# 16 prompts x 8, a checkpoint every 2 steps: once uninterrupted, once SIGKILLed after step 3 is logged and resumed
# with --resume. Prints the staleness per step, the tool metrics, and every non-timing metric that differs between
# the resumed run and the uninterrupted one (which version samples a round depends on timing, docs/async.md, so a
# difference there is reported, not hidden). Needs the repo's .venv.
set -u
O=$(realpath -m "$1")
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
PY=$REPO/.venv/bin/python
if [ -e "$O" ] && [ -n "$(ls -A "$O")" ] && [ ! -f "$O/.tool_async" ]; then
  echo "$O is not empty and not an earlier run.sh output: refusing to replace it"; exit 1
fi
rm -rf "$O"; mkdir -p "$O"; touch "$O/.tool_async"
DAPO="$PY -m dapo_rl.cli"
common="trainer.total_training_steps=6 trainer.max_generated_samples=0 trainer.test_freq=0 trainer.test_freq_samples=0
 trainer.save_freq=2 data.train_batch_size=16 data.gen_batch_size=32 async_training.max_staleness=1"
echo "uninterrupted $(date +%T)" >> "$O/log"
$DAPO train tiny_python_tool $common trainer.output_dir="$O/whole" > "$O/whole.out" 2>&1; echo "rc $?" >> "$O/log"
echo "kill $(date +%T)" >> "$O/log"
$DAPO train tiny_python_tool $common trainer.output_dir="$O/kill" > "$O/kill.out" 2>&1 &
P=$!
while ! grep -q '"step": 3' "$O/kill/metrics.jsonl" 2>/dev/null; do sleep 0.5; kill -0 $P 2>/dev/null || break; done
kill -9 $P; wait $P; echo "killed after $(wc -l < "$O/kill/metrics.jsonl") rows" >> "$O/log"
sleep 2; echo "engine processes left: $(pgrep -f 'dapo_rl.rollout.remote' | wc -l)" >> "$O/log"
$DAPO train tiny_python_tool $common trainer.output_dir="$O/kill" --resume > "$O/resume.out" 2>&1
echo "resume rc $? $(date +%T)" >> "$O/log"
$PY - "$O" <<'PYEOF'
import json, sys
from pathlib import Path
o = Path(sys.argv[1])
rows = lambda p: [json.loads(x) for x in (o / p / "metrics.jsonl").open()]
timing = ("time/", "perf/", "async/overlap_ratio", "async/push_s")
whole, kill = rows("whole"), rows("kill")
for name, rs in (("uninterrupted", whole), ("killed + resumed", kill)):
    tr = [r for r in rs if "async/staleness_max" in r]
    print(f"{name}: steps {[r['step'] for r in rs]}, staleness max {[r['async/staleness_max'] for r in tr]}, "
          f"stale groups dropped {sum(r['async/dropped_stale_groups'] for r in tr)}, tool/used_ratio "
          f"{[round(r['tool/used_ratio'], 3) for r in tr if 'tool/used_ratio' in r]}, tool/sandbox_error_rate "
          f"{[r['tool/sandbox_error_rate'] for r in tr if 'tool/sandbox_error_rate' in r]}")
bad = values = 0
by_step = {r["step"]: r for r in kill}  # a step logged before the kill and again after resume: the later row
for a in whole:
    b = by_step.get(a["step"], {})
    for k in sorted(set(a) | set(b)):
        if k.startswith(timing):
            continue
        values += 1
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            bad += 1
            if bad <= 12:
                print(f"  step {a['step']} {k}: {a.get(k, '<absent>')} vs {b.get(k, '<absent>')}")
print(f"resumed vs uninterrupted: {len(whole)} steps, {values} values, {bad} differ")
PYEOF
echo "done $(date +%T)" >> "$O/log"
