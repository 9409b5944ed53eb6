"""`dapo plot RUN_A RUN_B ...`: several runs overlaid, lines checked by hand, the PNG written by the real CLI."""

import json

from dapo_rl.cli import main
from dapo_rl.plotting import comparison_series, run_labels


def _run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_lines_labels_and_axes_by_hand(tmp_path):
    a = _run(
        tmp_path / "ablation" / "dapo" / "seed0",
        [
            {"step": 0, "val/aime/acc": 0.1},
            {"step": 1, "train/reward_mean": -0.5, "train/gen_samples_total": 64},
            {"step": 2, "train/reward_mean": -0.25, "train/gen_samples_total": 192, "val/aime/acc": 0.2},
        ],
    )
    b = _run(
        tmp_path / "ablation" / "grpo" / "seed0",
        [{"step": 1, "train/reward_mean": 0.0, "val/aime/acc": 0.3, "val/gsm/acc": 0.4}],
    )
    labels = run_labels([a, b])
    assert labels == ["dapo/seed0", "grpo/seed0"]
    runs = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)]
    by_step = comparison_series(runs, labels, "step")
    assert by_step["train/reward_mean"] == [("dapo/seed0", [1, 2], [-0.5, -0.25]), ("grpo/seed0", [1], [0.0])]
    assert by_step["val/*/acc"] == [
        ("dapo/seed0", [0, 2], [0.1, 0.2]),
        ("grpo/seed0 aime", [1], [0.3]),
        ("grpo/seed0 gsm", [1], [0.4]),
    ]
    by_samples = comparison_series(runs, labels, "samples")
    assert by_samples["train/reward_mean"][0] == ("dapo/seed0", [64, 192], [-0.5, -0.25])
    assert by_samples["val/*/acc"][0] == ("dapo/seed0", [0, 192], [0.1, 0.2])
    assert by_step["train/entropy"] == [("dapo/seed0", [], []), ("grpo/seed0", [], [])]

    out = tmp_path / "cmp.png"
    assert main(["plot", str(a), str(b), "--out", str(out), "--x", "samples"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert main(["plot", str(a), str(tmp_path), "--out", str(out)]) == 2  # not a run directory


def _png_size(path):
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_a_tool_run_gets_a_tool_row_in_the_training_figure(tmp_path):
    from dapo_rl.plotting import plot_training_dynamics, tool_panel_series

    rows = [
        {"step": 0, "val/chain_sum/acc": 0.118},
        {"step": 1, "train/acc_mean": 0.1, "tool/used_ratio": 0.525, "tool/calls_per_trajectory": 0.6,
         "tool/code_error_rate": 0.25, "tool/sandbox_error_rate": 0.0},
        {"step": 2, "train/acc_mean": 0.2, "tool/used_ratio": 0.75, "tool/calls_per_trajectory": 0.9,
         "tool/code_error_rate": 0.125, "tool/sandbox_error_rate": 0.0, "tool/timeout_rate": 0.5},
    ]  # fmt: skip
    assert tool_panel_series(rows) == [
        [("share that called the tool", [1, 2], [0.525, 0.75]), ("calls per response", [1, 2], [0.6, 0.9])],
        [
            ("code error", [1, 2], [0.25, 0.125]),
            ("timeout", [2], [0.5]),
            ("sandbox error", [1, 2], [0.0, 0.0]),
        ],
    ]
    assert tool_panel_series([{"step": 1, "train/acc_mean": 0.1}]) == []
    tool = _run(tmp_path / "tool", rows)
    plain = _run(
        tmp_path / "plain", [{k: v for k, v in r.items() if not k.startswith("tool/")} for r in rows]
    )
    w_tool, h_tool = _png_size(plot_training_dynamics(tool / "metrics.jsonl", tool / "fig.png"))
    w_plain, h_plain = _png_size(plot_training_dynamics(plain / "metrics.jsonl", plain / "fig.png"))
    assert (w_tool, w_plain) == (1100, 1100) and (h_plain, h_tool) == (
        1100,
        1450,
    )  # 11 x 11 in, + 3.5 in, 100 dpi
