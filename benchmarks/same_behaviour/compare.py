"""`python compare.py A B`: two `run.sh` outputs side by side. Every metric but timings must be equal (the
asynchronous run's too, where the engine process is deterministic); the resumed run equals the uninterrupted one;
`dapo eval`'s generations and summaries are identical in every field A has. Exit 1 on any difference."""

import json
import sys
from pathlib import Path

TIMING = ("time/", "perf/", "async/overlap_ratio", "async/push_s")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMING)}


def differ(ra: list[dict], rb: list[dict], label: str) -> int:
    if len(ra) != len(rb):
        print(f"{label}: {len(ra)} vs {len(rb)} rows")
        return 1
    bad = 0
    for x, y in zip(map(untimed, ra), map(untimed, rb)):
        for k in sorted(set(x) | set(y)):
            if x.get(k, "<absent>") != y.get(k, "<absent>"):
                bad += 1
                if bad <= 8:
                    print(
                        f"  {label} step {x.get('step')} {k}: {x.get(k, '<absent>')} vs {y.get(k, '<absent>')}"
                    )
    values = sum(len(untimed(x)) for x in ra)
    print(f"{label}: {len(ra)} rows, {values} values, {bad} differ")
    return bad


def main(a: Path, b: Path) -> int:
    bad = differ(rows(a / "sync/metrics.jsonl"), rows(b / "sync/metrics.jsonl"), "sync, 8 steps + validation")
    bad += differ(rows(a / "ranks2/metrics.jsonl"), rows(b / "ranks2/metrics.jsonl"), "2 ranks")
    bad += differ(rows(a / "async/metrics.jsonl"), rows(b / "async/metrics.jsonl"), "async K=1")
    for side in (a, b):
        st = [
            (r["step"], r["async/staleness_max"], r["async/dropped_stale_groups"])
            for r in rows(side / "async/metrics.jsonl")
            if "async/staleness_max" in r
        ]
        worst = max((s for _, s, _ in st), default=None)
        if worst is None:
            print(f"  {side.name}: no async/staleness_max rows (the asynchronous run did not run)")
        else:
            print(
                f"  {side.name}: staleness max {worst} (bound 1), stale groups dropped {sum(d for *_, d in st)}"
            )
        bad += worst is None or worst > 1
        bad += differ(
            rows(side / "sync/metrics.jsonl"),
            rows(side / "kill/metrics.jsonl"),
            f"{side.name}: SIGKILL + resume vs uninterrupted",
        )
    for ev in ("eval", "eval2"):  # B may add fields (2026-12-06: `status`, `error_rate`, `timeout_rate`)
        ga, gb = rows(a / ev / "generations.jsonl"), rows(b / ev / "generations.jsonl")
        sa, sb = (json.loads((side / ev / "summary.json").read_text()) for side in (a, b))
        same_gen = len(ga) == len(gb) and all(x == {k: y.get(k) for k in x} for x, y in zip(ga, gb))
        same_sum = sa.keys() == sb.keys() and all(sa[d] == {k: sb[d].get(k) for k in sa[d]} for d in sa)
        added = sorted({k for y in gb for k in y} - {k for x in ga for k in x}) + sorted(
            {k for d in sb for k in sb[d]} - {k for d in sa for k in sa[d]}
        )
        print(
            f"dapo eval {ev}: {len(ga)} generations identical {same_gen}, summary identical {same_sum}"
            + (f" (fields added: {', '.join(added)})" if added else "")
        )
        bad += not (same_gen and same_sum)
    print("differences:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
