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
