"""The DAPO paper's training-dynamics panels (Figure 7 style) from a run's `metrics.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a `metrics.jsonl` file (one JSON object per line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def stage_starts(rows: list[dict]) -> list[tuple[int, int]]:
    """`(first step, stage)` of each CAMPO stage after the first (`campo/stage` changes), in step order."""
    out, last = [], None
    for r in rows:
        stage = r.get("campo/stage")
        if stage is None:
            continue
        if last is not None and stage != last:
            out.append((r["step"], int(stage)))
        last = stage
    return out


def plot_training_dynamics(metrics_path: str | Path, out_path: str | Path) -> Path:
    """Draw the paper's training dynamics against the step, one panel each: reward and accuracy, response length
    and truncation rate, entropy, mean probability of the generated tokens (Fig. 7), the share of groups whose
    responses were all correct / all wrong (Fig. 3b), and validation accuracy; dashed lines where a CAMPO stage
    begins. A quantity the run did not log leaves its panel empty. A run that logged `tool/*` metrics (a tool
    episode, `dapo_rl.episode.tool`) gets a fourth row: `TOOL_PANELS`.

    Args:
        metrics_path: a run's `metrics.jsonl`.
        out_path: the PNG to write.

    Returns:
        `out_path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)

    def series(key):
        pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    tools = tool_panel_series(rows)
    fig, axes = plt.subplots(
        3 + bool(tools), 2, figsize=(11, 11 + 3.5 * bool(tools)), sharex=True, squeeze=False
    )
    ax = axes[0, 0]
    ax.plot(*series("train/reward_mean"), label="reward (shaped score)")
    ax.plot(*series("train/acc_mean"), label="accuracy")
    ax.set_title("Training reward and accuracy (all sampled responses)")
    ax.legend()
    ax = axes[0, 1]
    ax.plot(*series("train/response_length_mean"), label="mean")
    ax.plot(*series("train/response_length_max"), label="max", alpha=0.6)
    ax.set_title("Response length (tokens)")
    ax.legend(loc="upper left")
    clip = series("train/response_clip_ratio")
    if clip[0]:
        twin = ax.twinx()
        twin.plot(*clip, color="tab:red", alpha=0.5, label="truncated share")
        twin.set_ylim(0, 1)
        twin.legend(loc="upper right")
    ax = axes[1, 0]
    ax.plot(*series("train/entropy"))
    ax.set_title("Entropy of the actor (nats per token)")
    ax = axes[1, 1]
    ax.plot(*series("train/token_prob_mean"))
    ax.set_title("Mean probability of the generated tokens")
    ax = axes[2, 0]
    ax.plot(*series("train/all_correct_group_ratio"), label="all correct")
    ax.plot(*series("train/all_wrong_group_ratio"), label="all wrong")
    ax.set_ylim(0, 1)
    ax.set_title("Share of prompt groups whose responses are all correct / all wrong")
    ax.legend()
    ax = axes[2, 1]
    for key in sorted({k for r in rows for k in r if k.startswith("val/") and k.endswith("/acc")}):
        ax.plot(*series(key), marker="o", label=key)
    ax.set_title("Validation accuracy")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    for ax, ((title, ylim, _), lines) in zip(axes[3] if tools else (), zip(TOOL_PANELS, tools)):
        for label, xs, ys in lines:
            ax.plot(xs, ys, label=label)
        ax.set_title(title)
        if ylim:
            ax.set_ylim(0, 1)
        if lines:
            ax.legend()
    starts = stage_starts(rows)
    for a in axes.flat:
        _step_axis(a)
        a.grid(alpha=0.3)
        for step, stage in starts:
            a.axvline(step - 0.5, color="gray", linestyle="--", alpha=0.6)
            a.text(
                step - 0.5, 1.0, f" stage {stage}", transform=a.get_xaxis_transform(), fontsize=7, va="top"
            )
    for a in axes[:-1].flat:  # one x axis for all panels: labelled once, at the bottom
        a.set_xlabel("")
    return _save(fig, out_path)


TOOL_PANELS = (
    (
        "Tool use (training responses)",
        False,
        (
            ("tool/used_ratio", "share that called the tool"),
            ("tool/calls_per_trajectory", "calls per response"),
        ),
    ),
    (
        "Tool calls that failed (share of calls); void responses",
        True,
        (
            ("tool/code_error_rate", "code error"),
            ("tool/timeout_rate", "timeout"),
            ("tool/truncated_rate", "output truncated"),
            ("tool/sandbox_error_rate", "sandbox error"),
            ("tool/void_ratio", "void (share of responses)"),
        ),
    ),
)
"""The tool row of `plot_training_dynamics`: per panel its title, whether the y axis is [0, 1], and its
`(metric key, legend)` lines (docs/metrics.md, "Tool episodes")."""


def tool_panel_series(rows: list[dict]) -> list[list[tuple[str, list, list]]]:
    """The lines of the tool row, per `TOOL_PANELS` panel `(legend, steps, values)` for each metric the run logged;
    `[]` when it logged no `tool/*` metric (no tool row)."""
    if not any(k.startswith("tool/") for r in rows for k in r):
        return []
    out = []
    for _, _, keys in TOOL_PANELS:
        lines = []
        for key, label in keys:
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                lines.append((label, [p[0] for p in pts], [p[1] for p in pts]))
        out.append(lines)
    return out


COMPARE_PANELS = (
    ("train/reward_mean", "Training reward (shaped score)"),
    ("val/*/acc", "Validation accuracy"),
    ("train/response_length_mean", "Mean response length (tokens)"),
    ("train/response_clip_ratio", "Truncated share of responses"),
    ("train/entropy", "Entropy of the actor (nats per token)"),
    ("train/all_correct_group_ratio", "Share of all-correct groups"),
)
"""`plot_comparison`'s panels: metric key (`val/*/acc`: every validation set) and title."""


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Legend names for runs: each directory's name, with parent folders added until the names differ
    (`ablation/dapo/seed0` and `ablation/grpo/seed0` -> `dapo/seed0`, `grpo/seed0`)."""
    parts = [Path(d).resolve().parts for d in run_dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in run_dirs]


def comparison_series(
    runs: list[list[dict]], labels: list[str], x: str = "step"
) -> dict[str, list[tuple[str, list[float], list[float]]]]:
    """The lines of `plot_comparison`: panel key -> `(legend name, xs, ys)` per run (per validation set for
    `val/*/acc`). `x`: `step`, or `samples` (the run's `train/gen_samples_total` at that row; 0 before the first
    step)."""
    out: dict[str, list[tuple[str, list[float], list[float]]]] = {}
    for key, _ in COMPARE_PANELS:
        lines = out.setdefault(key, [])
        for label, rows in zip(labels, runs):
            keys = (
                sorted({k for r in rows for k in r if k.startswith("val/") and k.endswith("/acc")})
                if key == "val/*/acc"
                else [key]
            )
            for k in keys:
                samples = 0
                xs, ys = [], []
                for r in rows:
                    samples = r.get("train/gen_samples_total", samples)
                    if r.get(k) is not None:
                        xs.append(r["step"] if x == "step" else samples)
                        ys.append(r[k])
                lines.append(
                    (label if key != "val/*/acc" or len(keys) == 1 else f"{label} {k[4:-4]}", xs, ys)
                )
    return out


def plot_comparison(run_dirs: list[str | Path], out_path: str | Path, x: str = "step") -> Path:
    """Overlay several runs, one line per run in each panel of `COMPARE_PANELS` (`dapo plot RUN_A RUN_B ...`;
    lines from `comparison_series`, legend from `run_labels`).

    Args:
        run_dirs: run directories, each with a `metrics.jsonl`.
        out_path: the PNG to write.
        x: `step` or `samples` (`train/gen_samples_total`: the fair axis between runs that sample at different
            rates per step, such as with and without dynamic sampling).

    Returns:
        `out_path`.

    Raises:
        ValueError: a directory without `metrics.jsonl`, or an unknown `x`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in ("step", "samples"):
        raise ValueError(f"x={x!r}: choose step or samples")
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / "metrics.jsonl").is_file():
            raise ValueError(f"{d}: no metrics.jsonl (is it a run directory?)")
    series = comparison_series([read_metrics(d / "metrics.jsonl") for d in dirs], run_labels(dirs), x)
    fig, axes = plt.subplots(3, 2, figsize=(12, 11), sharex=True)
    for (key, title), ax in zip(COMPARE_PANELS, axes.flat):
        for name, xs, ys in series[key]:
            ax.plot(xs, ys, marker="o" if key.startswith("val/") else None, markersize=3, label=name)
        ax.set_title(title)
        if x == "step":
            _step_axis(ax)
        else:
            ax.set_xlabel("sampled responses")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in axes[:-1].flat:
        ax.set_xlabel("")
    return _save(fig, out_path)


def plot_sft(metrics_path: str | Path, out_path: str | Path) -> Path:
    """`dapo sft`'s curves on chat data (`dapo_rl.sft_chat`): training loss (completion tokens) and learning rate
    against the step.

    Returns:
        `out_path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path) if Path(metrics_path).exists() else []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "train/loss", "Loss on completion tokens"),
        (axes[1], "train/lr", "Learning rate"),
    ):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
        ax.set_title(title)
        _step_axis(ax)
        ax.grid(alpha=0.3)
    return _save(fig, out_path)


def _step_axis(ax) -> None:
    """Label an x axis of steps, ticks on whole steps only (a 2-step run would otherwise read 0.25, 0.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, out_path: str | Path) -> Path:
    """Lay out, write the PNG, free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
