"""How well a prompt's last group predicts its next one: the floor under zero-waste dynamic sampling.

Dynamic sampling wastes the groups whose n answers are all right or all wrong. A sampler that knows each prompt's
past groups (`algorithm.filter_groups.prioritize`, `skip_*`) can only avoid what those groups predict. This script
samples 2n responses per training prompt from one model at the recipe's settings (`dapo eval`, one policy, so the two
halves are independent draws of the same pass rate), splits them into a first and a second group of n, and prints:

- the share of first groups that are unanimous (what a sampler pays on a prompt it has never drawn);
- for each first-group outcome c of n: how often the second group is unanimous, against `unanimous_chance(c, n)`;
- the waste of a sampler that draws only prompts whose last group had c in [lo, hi], and how many prompts that
  leaves;
- the unanimous share by the chain's term count (a difficulty feature a cross-prompt predictor could use).

It measures a fixed policy: in training the policy moves the prompts it learns, so this is a lower bound on what
history buys, not the waste of a run (`dapo ablate zero_waste_epochs` measures that).

    python benchmarks/zero_waste_floor.py --model ~/.cache/dapo_rl/models/tiny-chain_sum-<hash>   # ~5-12 min
    python benchmarks/zero_waste_floor.py --model PATH --prompts 64 --n 4
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from dapo_rl.collect import unanimous_chance
from dapo_rl.data import reasoning_gym_samples


def write_prompts(path: Path, size: int) -> None:
    """The first `size` training prompts of `tiny_chain_steps` (reasoning-gym chain_sum, seed 0, 2-5 terms of 1-2
    digits) as verl-schema JSONL (`dapo eval` keeps one of each distinct prompt)."""
    params = {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 2}
    samples = reasoning_gym_samples("chain_sum", size, 0, params, True)
    with path.open("w") as f:
        for s in samples:
            row = {
                "data_source": s.data_source,
                "prompt": s.prompt,
                "reward_model": {"ground_truth": s.ground_truth},
                "extra_info": s.extra_info,
            }
            f.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", required=True, help="a local checkpoint (e.g. the cached tiny_chain_steps warm-up)"
    )
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--n", type=int, default=8, help="group size (the recipe's rollout.n)")
    ap.add_argument("--out", default="runs/zero_waste_floor")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_prompts(out / "prompts.jsonl", args.prompts)
    cmd = [
        sys.executable,
        "-m",
        "dapo_rl.cli",
        "eval",
        "--model",
        args.model,
        "--data",
        str(out / "prompts.jsonl"),
    ]
    cmd += ["--n", str(2 * args.n), "--temperature", "1.0", "--top-p", "1.0", "--max-tokens", "48"]
    cmd += ["--template", "none", "--seed", "0", "--output", str(out / "eval")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    n = args.n
    groups: dict[int, list[list[bool]]] = defaultdict(lambda: [[], []])
    tokens: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    terms: dict[int, int] = {}
    for line in (out / "eval" / "generations.jsonl").read_text().splitlines():
        r = json.loads(line)
        half = 0 if r["sample_idx"] < n else 1
        groups[r["problem_idx"]][half].append(bool(r["acc"]))
        tokens[r["problem_idx"]][half] += int(r["response_length"])
        terms[r["problem_idx"]] = len(re.findall(r"\d+", r["prompt"]))
    ids = sorted(groups)

    def unanimous(acc: list[bool]) -> bool:
        return all(acc) or not any(acc)

    def second_waste(chosen: list[int]) -> tuple[float, float]:
        """(share of groups, share of tokens) of the chosen prompts' second groups that are unanimous."""
        if not chosen:
            return float("nan"), float("nan")
        groups_u = sum(unanimous(groups[i][1]) for i in chosen) / len(chosen)
        tok = sum(tokens[i][1] for i in chosen)
        return groups_u, sum(tokens[i][1] for i in chosen if unanimous(groups[i][1])) / max(tok, 1)

    first = sum(unanimous(groups[i][0]) for i in ids) / len(ids)
    first_tok = sum(tokens[i][0] for i in ids if unanimous(groups[i][0])) / sum(tokens[i][0] for i in ids)
    print(
        f"{len(ids)} prompts, 2 groups of {n}; first groups unanimous: {first:.3f} ({first_tok:.3f} of tokens)"
    )
    print(f"| first group right | prompts | next group unanimous | (tokens) | unanimous_chance({n}) |")
    print("|---|---|---|---|---|")
    for c in range(n + 1):
        chosen = [i for i in ids if sum(groups[i][0]) == c]
        if chosen:
            g, t = second_waste(chosen)
            print(f"| {c} | {len(chosen)} | {g:.3f} | {t:.3f} | {unanimous_chance(c, n):.3f} |")
    for lo in range(1, n // 2 + 1):
        hi = n - lo
        chosen = [i for i in ids if lo <= sum(groups[i][0]) <= hi]
        g, t = second_waste(chosen)
        print(
            f"draw only prompts whose last group had {lo}-{hi} of {n} right: {len(chosen)} prompts "
            f"({len(chosen) / len(ids):.0%}), next group unanimous {g:.3f} ({t:.3f} of tokens)"
        )
    for k in sorted(set(terms.values())):
        chosen = [i for i in ids if terms[i] == k]
        both = [groups[i][h] for i in chosen for h in (0, 1)]
        if both:
            print(
                f"{k} terms: {len(chosen)} prompts, unanimous {sum(map(unanimous, both)) / len(both):.3f} "
                f"(all wrong {sum(not any(x) for x in both) / len(both):.3f})"
            )


if __name__ == "__main__":
    main()
