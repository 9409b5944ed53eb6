"""The DAPO paper's training-dynamics panels (Figure 7 style) from a run's `metrics.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a `metrics.jsonl` file (one JSON object per line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_training_dynamics(metrics_path: str | Path, out_path: str | Path) -> Path:
    """Draw the paper's training dynamics against the step, one panel each: reward and accuracy, response length
    and truncation rate, entropy, mean probability of the generated tokens (Fig. 7), the share of groups whose
    responses were all correct / all wrong (Fig. 3b), and validation accuracy. A quantity the run did not log
    leaves its panel empty.

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

    fig, axes = plt.subplots(3, 2, figsize=(11, 11))
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
    for a in axes.flat:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
