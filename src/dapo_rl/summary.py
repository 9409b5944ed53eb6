"""The closing summary `dapo train` prints when a run ends: held-out accuracy before and after, wall time, and where
the run directory, the last checkpoint and the figure are.

It reads the run's `metrics.jsonl`, so a resumed run reports from its first validation (step 0 of the first
process), not from where it was resumed.
"""

from __future__ import annotations

from pathlib import Path

from dapo_rl.plotting import read_metrics


def _fmt_minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def validation_endpoints(metrics_path: str | Path) -> dict[str, tuple[int, float, int, float]]:
    """First and last value of every `val/<dataset>/acc` in a run's `metrics.jsonl`.

    Args:
        metrics_path: the run's `metrics.jsonl` (one JSON object per line, each with `step`).

    Returns:
        `{dataset: (first_step, first_acc, last_step, last_acc)}`, accuracies in [0, 1], in the order the datasets
        first appear; `{}` when the file is missing or no row validated.
    """
    path = Path(metrics_path)
    out: dict[str, tuple[int, float, int, float]] = {}
    if not path.is_file():
        return out
    for row in read_metrics(path):
        for key, value in row.items():
            if key.startswith("val/") and key.endswith("/acc") and isinstance(value, (int, float)):
                name = key[len("val/") : -len("/acc")]
                first = out.get(name, (row["step"], float(value)))[:2]
                out[name] = (*first, row["step"], float(value))
    return out


def closing_summary(
    run_dir: str | Path,
    metrics_path: str | Path,
    checkpoint: str | Path | None,
    figure: str | Path,
    wall_seconds: float,
    steps: int,
    warmup_seconds: float = 0.0,
    resumed_at: int = 0,
) -> str:
    """The lines `dapo train` prints at the end of a run (rank 0).

    Args:
        run_dir: `trainer.output_dir`.
        metrics_path: its `metrics.jsonl`.
        checkpoint: the newest checkpoint directory (`checkpoints/global_step_N`), or None when none was written.
        figure: `training_dynamics.png`.
        wall_seconds: seconds since `dapo train` started, warm-up included.
        steps: the step the run ended at.
        warmup_seconds: seconds spent building the embedded base model in this run (0: cached or not used).
        resumed_at: the checkpoint's step this run resumed from (0: a new run); the head line then counts only the
            steps this run took.

    Returns:
        A few lines of text, e.g.::

            dapo train: done, 200 steps in 12m31s (the warm-up 4m50s of it)
              held out   chain_sum: 0.094 at step 0 -> 0.232 at step 200 (+13.8 points)
              run        runs/tiny_chain_steps (metrics.jsonl, config.yaml)
              checkpoint runs/tiny_chain_steps/checkpoints/global_step_200 (model/ loads with from_pretrained)
              figure     runs/tiny_chain_steps/training_dynamics.png
    """
    if resumed_at > 0 and steps <= resumed_at:
        head = f"dapo train: done, no step left after step {resumed_at} (resumed) in {_fmt_minutes(wall_seconds)}"
    elif resumed_at > 0:
        took = f"step {steps}" if steps == resumed_at + 1 else f"steps {resumed_at + 1}-{steps}"
        head = f"dapo train: done, {took} (resumed from step {resumed_at}) in {_fmt_minutes(wall_seconds)}"
    else:
        head = f"dapo train: done, {steps} step{'' if steps == 1 else 's'} in {_fmt_minutes(wall_seconds)}"
    if warmup_seconds > 0:
        head += f" (the warm-up {_fmt_minutes(warmup_seconds)} of it)"
    lines = [head]
    for name, (s0, a0, s1, a1) in validation_endpoints(metrics_path).items():
        if s1 == s0:
            lines.append(f"  held out   {name}: {a0:.3f} at step {s0} (validated once)")
        else:
            lines.append(
                f"  held out   {name}: {a0:.3f} at step {s0} -> {a1:.3f} at step {s1} ({100 * (a1 - a0):+.1f} points)"
            )
    lines.append(f"  run        {run_dir} (metrics.jsonl, config.yaml)")
    if checkpoint is not None:
        adapter = (Path(checkpoint) / "adapter").is_dir()
        lines.append(
            f"  checkpoint {checkpoint} (model/ loads with from_pretrained"
            + ("; adapter/ with peft's PeftModel.from_pretrained" if adapter else "")
            + "; --resume continues from it)"
        )
    if Path(figure).is_file():
        lines.append(f"  figure     {figure}")
    return "\n".join(lines)
