"""Evaluation as the papers report it: avg@k, unbiased pass@k, maj@k per dataset (`dapo eval`, trainer validation).

DAPO reports AIME 2024 avg@32 (30 problems x 32 samples, temperature 1.0, top_p 0.7); MiroMind-M1 reports avg@64 on
AIME and avg@5 on MATH-500. For each problem with n sampled responses, c of them correct:

    avg@n  = mean over problems of c / n                                  (mean accuracy over all samples)
    pass@k = mean over problems of 1 - C(n - c, k) / C(n, k)              (Chen et al. 2021, unbiased, k <= n)
    maj@k  = mean over problems of acc(most frequent answer among the first k samples), answers the verifier judges
             equivalent counted as one (`pool_equivalent_answers`)
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dapo_rl.data.dataset import DataError, Sample, _read_rows, load_samples
from dapo_rl.data.templates import apply_prompt_template
from dapo_rl.episode import Episode, Rollout
from dapo_rl.rollout.seeds import Stream, round_seed

"""The `boxed` template (Qwen2.5-Math's CoT instruction), appended to a bare problem."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: the chance that k samples drawn without replacement from n, of which c are
    correct, contain a correct one: `1 - C(n - c, k) / C(n, k)` (Chen et al. 2021, Eq. 1), computed as a stable
    product.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_vote(preds: Sequence[str], accs: Sequence[bool]) -> bool:
    """Correctness of the most frequent answer; a tie goes to the tied answer that appeared first.

    Empty and `[INVALID]` answers do not vote; with no valid answer the vote is wrong.
    """
    valid = [(p, a) for p, a in zip(preds, accs) if p and p != "[INVALID]"]
    if not valid:
        return False
    counts = Counter(p for p, _ in valid)
    best = max(counts.values())
    winner = next(p for p, _ in valid if counts[p] == best)
    return bool(next(a for p, a in valid if p == winner))


def _votes(pred: str) -> bool:
    return bool(pred) and pred != "[INVALID]"


def pool_equivalent_answers(groups: Sequence[Sequence[Rollout]], pool) -> None:
    """Set each rollout's `vote` so that maj@k counts answers the verifier judges equivalent as one (`1/2`,
    `0.5` and `\\frac{1}{2}` pool their votes instead of losing to two copies of `3`).

    Within each problem the distinct answers are clustered greedily in order of first appearance: an answer joins
    the first cluster whose representative (its first answer) the verifier accepts it against, scored as the
    response `Answer: <answer>` with the representative as the ground truth, through the reward pool with
    `lenient=True` (equivalence alone: ``2^{10}`` joins ``1024`` as ``1024`` joins ``2^{10}``), so every
    comparison is bounded by `reward.timeout_s` (a timeout or error keeps the answers apart). Identical strings
    pool without a call; empty and `[INVALID]` answers do not vote. One pool call per round of comparisons,
    across all problems.

    Args:
        groups: the rollouts of each problem (scored: `pred` set).
        pool: `dapo_rl.reward.pool.RewardPool` of the evaluation's verifier.
    """
    todo = []  # per problem: (distinct answers in order, data_source, representatives found so far)
    for g in groups:
        # a code reward's pred is a test count ("7/7"): identical strings pool, no verifier call
        distinct = [] if any(r.code for r in g) else list(dict.fromkeys(r.pred for r in g if _votes(r.pred)))
        todo.append((distinct, g[0].sample.data_source if g else "", []))
    rep_of: list[dict[str, str]] = [{} for _ in groups]
    for step in range(max((len(d) for d, _, _ in todo), default=0)):
        items, owners = [], []
        for gi, (distinct, source, reps) in enumerate(todo):
            if step < len(distinct):
                for rep in reps:
                    items.append((source, f"Answer: {distinct[step]}", rep, None))
                    owners.append((gi, rep))
        results = pool.score(items, lenient=True) if items else []
        matched: dict[int, str] = {}
        for (gi, rep), res in zip(owners, results):
            if res["acc"] and gi not in matched:  # the first representative that accepts it
                matched[gi] = rep
        for gi, (distinct, _, reps) in enumerate(todo):
            if step < len(distinct):
                answer = distinct[step]
                rep_of[gi][answer] = matched.get(gi, answer)
                if gi not in matched:
                    reps.append(answer)
    for g, reps in zip(groups, rep_of):
        for r in g:
            r.vote = reps.get(r.pred, "")


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return ks + ([n] if n not in ks else [])


def dataset_metrics(records: Sequence[Rollout], n: int) -> dict[str, float | None]:
    """Metrics of one dataset from its scored rollouts.

    Args:
        records: `Rollout`s (`problem_idx`, `sample_idx`, `acc`, `pred`, `model_length`, `finish_reason` are
            read); every problem must have samples 0..n-1.
        n: samples per problem.

    Returns:
        `avg@n`, `avg@n_stderr` (standard error over problems: the sd of the per-problem mean accuracy over
        sqrt(problems); None for one problem), `pass@k` and `maj@k` for k in 1, 2, 4, ... <= n (and n), `num_problems`, `num_samples`,
        `response_length_mean`, `truncation_rate`, `error_rate` and `timeout_rate` (shares of the samples the
        verifier raised on or was killed on: `Rollout.status`; they count as wrong; None when a record's status is
        `unknown`); from a tool episode, `tool_used_rate` (share of samples with a call) and `tool_calls_mean`;
        scored by the code reward (every `Rollout.code` set), no `maj@k` (there is no answer to vote on) and the
        `code_*_rate`s of its outcomes and `code_hack_rate`.

    Raises:
        ValueError: a problem without exactly n samples.
    """
    by_problem: dict[int, list[Rollout]] = {}
    for r in records:
        by_problem.setdefault(r.problem_idx, []).append(r)
    for pid, rs in by_problem.items():
        if len(rs) != n:
            raise ValueError(f"problem {pid} has {len(rs)} samples, expected {n}")
        rs.sort(key=lambda r: r.sample_idx)
    out: dict[str, float] = {f"avg@{n}": float(np.mean([r.acc for r in records]))}
    per_problem = [float(np.mean([r.acc for r in rs])) for rs in by_problem.values()]
    out[f"avg@{n}_stderr"] = (  # undefined for one problem (no spread to estimate), not 0
        float(np.std(per_problem, ddof=1) / math.sqrt(len(per_problem))) if len(per_problem) > 1 else None
    )
    for k in ks_up_to(n):
        out[f"pass@{k}"] = float(
            np.mean([pass_at_k(n, sum(r.acc for r in rs), k) for rs in by_problem.values()])
        )
    code = bool(records) and all(r.code for r in records)  # scored by the code reward: no answers to vote on
    for k in [] if code else ks_up_to(n):
        out[f"maj@{k}"] = float(
            np.mean(
                [
                    majority_vote([r.vote or r.pred for r in rs[:k]], [r.acc for r in rs[:k]])
                    for rs in by_problem.values()
                ]
            )
        )
    out["num_problems"] = len(by_problem)
    out["num_samples"] = len(records)
    out["response_length_mean"] = float(np.mean([r.model_length for r in records]))
    out["truncation_rate"] = float(np.mean([r.truncated for r in records]))
    known = all(r.status != "unknown" for r in records)  # generations.jsonl lines from before `status`
    out["error_rate"] = float(np.mean([r.status == "error" for r in records])) if known else None
    out["timeout_rate"] = float(np.mean([r.status == "timeout" for r in records])) if known else None
    if any(r.tool_calls is not None for r in records):  # a tool episode's
        out["tool_used_rate"] = float(np.mean([bool(r.tool_calls) for r in records]))
        out["tool_calls_mean"] = float(np.mean([len(r.tool_calls or ()) for r in records]))
    if code:
        for o in ("compile_error", "runtime_error", "timeout", "sandbox_error", "no_code"):
            out[f"code_{o}_rate"] = float(np.mean([r.code == o for r in records]))
        out["code_hack_rate"] = float(np.mean([bool(r.code_hacks) for r in records]))
    return out


def unscored_report(
    summary: dict[str, dict[str, float | None]], gen_path: str | Path, verifier: str
) -> tuple[list[str], bool]:
    """What `dapo eval` says about responses its verifier could not score (they count as wrong).

    Args:
        summary: dataset name -> `dataset_metrics` (`error_rate`, `timeout_rate`: None for generations written
            before `status`).
        gen_path: the generations.jsonl the rows are in. verifier: `reward.name`.

    Returns:
        The lines for stderr (a note per dataset of unknown share, a warning per dataset with unscored responses,
        an error naming the datasets with none scored), and whether some dataset had none scored (`dapo eval`
        exits 5 then: its accuracies are not measurements).
    """
    lines, nothing = [], []
    for name, m in summary.items():
        if m["error_rate"] is None:
            lines.append(
                f"note: {name}: some generations in {gen_path} were written before 2026-12-06 without `status`; "
                "how many the verifier could not score is unknown (a new --output scores them afresh)"
            )
            continue
        share = m["error_rate"] + m["timeout_rate"]
        if share > 0:
            lines.append(
                f"warning: {name}: {share:.1%} of the responses could not be scored and count as wrong "
                f"(verifier {verifier}: errors {m['error_rate']:.1%}, timeouts {m['timeout_rate']:.1%}; "
                f"the rows with status error/timeout in {gen_path})"
            )
        if share == 1.0:
            nothing.append(name)
    if nothing:
        lines.append(f"error: the verifier {verifier} scored none of the responses of {', '.join(nothing)}")
    return lines, bool(nothing)


# ------------------------------------------------------------------------------------------------- eval data
@dataclass
class EvalSet:
    """One evaluation file: unique problems (rows repeated k times, as in DAPO's 30 x 32 AIME file, are grouped)."""

    name: str
    samples: list[Sample]
    repeats: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def load_eval_set(path: str | Path, template: str = "none") -> EvalSet:
    """Read an evaluation file in any of the shared formats, detecting which.

    Formats: verl parquet/JSONL (`prompt` + `reward_model.ground_truth`); `problem` + `answer` (AIME, AMC, MATH-500);
    `prompt` (a string) + `answer` (Qwen's QwQ copies); GSM8K `question` + `answer` ending in "#### N" (the number
    after "####" is the ground truth). Identical (prompt, answer) rows are grouped into one problem.

    Args:
        path: `.parquet` or `.jsonl` file.
        template: `none`, `dapo` (DAPO's "Answer:" template) or `boxed` (reason step by step, answer in \\boxed{}).

    Raises:
        DataError: unreadable file, unknown format, or a row without its fields (file and row named).
    """
    from dapo_rl.reward.math_verifier import gsm8k_ground_truth

    path = Path(path)
    rows = _read_rows(path, required=())
    if not rows:
        raise DataError(f"{path}: no rows")
    first = rows[0][1]
    if not isinstance(first, dict):
        raise DataError(f"{path}: {rows[0][0]}: expected an object")
    if "reward_model" in first:
        samples = load_samples(path)
    else:
        samples = []
        for i, (at, row) in enumerate(rows):
            if not isinstance(row, dict) or "answer" not in row or row["answer"] is None:
                raise DataError(f"{path}: {at}: field 'answer' is missing")
            text = next(
                (row[k] for k in ("problem", "prompt", "question") if isinstance(row.get(k), str)), None
            )
            if text is None:
                raise DataError(f"{path}: {at}: no 'problem', 'prompt' or 'question' text field")
            gt = row["answer"]
            if isinstance(gt, str) and "####" in gt:
                gt = gsm8k_ground_truth(gt)
            samples.append(
                Sample(f"{path.stem}:{i}", "math", [{"role": "user", "content": text}], str(gt), {})
            )
    for s in samples:
        s.prompt = apply_prompt_template(s.prompt, template)
    unique: dict[tuple, Sample] = {}
    for s in samples:
        unique.setdefault((json.dumps(s.prompt, sort_keys=True), s.ground_truth), s)
    repeats = len(samples) // len(unique) if len(samples) % len(unique) == 0 else 1
    return EvalSet(path.stem, list(unique.values()), repeats, {"rows": len(samples)})


@dataclass
class ChatPrompts:
    """An evaluation set for a served model (`OpenAIChatEngine`): the samples' chat messages go to the server as
    they are, so there are no token ids and no length filter (the server rejects what does not fit)."""

    samples: list[Sample]
    name: str
    num_dropped: int = 0
    prompt_ids: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        self.prompt_ids = [[] for _ in self.samples]

    def __len__(self) -> int:
        return len(self.samples)


# ------------------------------------------------------------------------------------------------- running
def evaluate_dataset(
    engine,
    ds,
    params,
    episode: Episode,
    *,
    done: dict[int, list[Rollout]] | None = None,
    only: Sequence[int] | None = None,
    on_records=None,
    chunk_problems: int = 64,
    progress=None,
    rank: int = 0,
) -> list[Rollout]:
    """Sample `params.n` responses for every problem of a `PromptDataset`, score them, return the rollouts.

    Args:
        engine: a `RolloutEngine`, or None on a rank that has none (then `only` must be empty).
        ds: `dapo_rl.data.PromptDataset` (samples and prompt token ids).
        params: `SamplingParams`; `params.seed` (if set) is the evaluation's seed: chunk c of the dataset named
            `ds.name` samples with `round_seed(params.seed, crc32(ds.name), c, rank, Stream.EVAL)`
            (`dapo_rl.rollout.seeds`), so no two requests share a seed and a dataset's seeds do not depend on the
            other datasets evaluated with it. A resumed run samples every chunk it had not started as an
            uninterrupted run would; a chunk it had half done samples its remaining problems with other request
            indices (request i is the i-th problem still to do).
        episode: samples and scores (`Episode.unshaped`: evaluation shapes nothing).
        done: rollouts already written, by problem index (resume): those problems are not generated again.
        only: evaluate just these problem indices (a rank's share); None: all.
        on_records: called with each chunk's new rollouts (the CLI appends them to generations.jsonl).
        chunk_problems: problems generated together.
        progress: optional callable(number of problems finished in this chunk).
        rank: this process's rank (each samples its share with its own seeds).

    Returns:
        The rollouts of the problems evaluated (with `done`'s), ordered by problem then sample.
    """
    from dataclasses import replace

    done = done or {}
    part = zlib.crc32(str(getattr(ds, "name", "")).encode())
    wanted = set(range(len(ds))) if only is None else set(only)
    records: list[Rollout] = []
    todo = [i for i in range(len(ds)) if i not in done and i in wanted]
    for c, start in enumerate(range(0, len(ds), chunk_problems)):
        idx = [i for i in todo if start <= i < start + chunk_problems]
        if not idx and (engine is None or not engine.collective):
            # an engine shared by a tensor-parallel group samples only when all its ranks call it; None: this rank
            # has no engine (asynchronous training's ranks but 0) and nothing to sample
            continue
        p = replace(
            params, seed=None if params.seed is None else round_seed(params.seed, part, c, rank, Stream.EVAL)
        )
        groups, _ = episode.sample(engine, ds, idx, p)
        new = [r for g in groups for r in g]
        if params.n > 1:
            pool_equivalent_answers(groups, episode.pool)
        if on_records is not None:
            on_records(new)
        records.extend(new)
        if progress is not None:
            progress(len(idx))
    for rs in done.values():
        records.extend(rs)
    records.sort(key=lambda r: (r.problem_idx, r.sample_idx))
    return records


def _cell(v: float | None) -> str:
    """A metric in report.md: 4 decimals, `-` where it does not apply (maj@k of code, scored by tests)."""
    return "-" if v is None else f"{v:.4f}"


def format_markdown(
    summary: dict[str, dict[str, float | None]], settings: dict, wall_s: float | None = None
) -> str:
    """`dapo eval`'s report.md: the settings (and `wall_s`, this invocation's seconds: a resumed evaluation counts
    only its own), then one row per dataset: problems, avg@n ± its standard error, the largest k's pass@k and maj@k,
    mean response length, truncated share, the share the verifier could not score (errors and timeouts: counted
    wrong; `?` for generations written before `status`), prompts dropped for length."""
    n = settings["n"]
    head = ", ".join(f"{k} {v}" for k, v in settings.items() if k != "model")
    lines = [
        f"# dapo eval: `{settings['model']}`",
        "",
        head + (f"; this invocation took {wall_s / 60:.1f} min" if wall_s else ""),
        "",
    ]
    lines += [
        f"| dataset | problems | avg@{n} | pass@{n} | maj@{n} | mean length | truncated | unscored "
        "| dropped prompts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in summary.items():
        se = m[f"avg@{n}_stderr"]
        err, tmo = m.get("error_rate", 0.0), m.get("timeout_rate", 0.0)
        lines.append(
            f"| {name} | {m['num_problems']} | {m[f'avg@{n}']:.4f}"
            + (" (one problem)" if se is None else f" ± {se:.4f}")
            + f" | {m[f'pass@{n}']:.4f} | {_cell(m.get(f'maj@{n}'))} | {m['response_length_mean']:.1f} "
            f"| {m['truncation_rate']:.3f} | {'?' if err is None else f'{err + tmo:.3f}'} "
            f"| {m.get('dropped_prompts', 0)} |"
        )
    return "\n".join(lines) + "\n"


def format_table(summary: dict[str, dict[str, float | None]]) -> str:
    """A plain-text table for the console: one row per metric, one column per dataset (a dataset's summary has
    20-odd metrics; a set of datasets is a few columns). Floats with 4 decimals; a metric a dataset lacks, or None
    (the standard error of one problem), is `-`."""
    names = list(summary)
    metrics: list[str] = []
    for m in summary.values():
        metrics += [k for k in m if k not in metrics]

    def cell(v) -> str:
        return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)

    grid = [["metric", *names]] + [[k, *(cell(summary[n].get(k)) for n in names)] for k in metrics]
    widths = [max(len(row[c]) for row in grid) for c in range(len(grid[0]))]
    return "\n".join(
        "  ".join(x.ljust(w) if c == 0 else x.rjust(w) for c, (x, w) in enumerate(zip(row, widths))).rstrip()
        for row in grid
    )
