"""`dapo ablate`: DAPO's ablation (paper Table 1) in miniature, at equal budgets of generated samples.

An ablation spec (`configs/ablation/*.yaml`) names a base recipe, a budget of sampled training responses per run,
and rows: each row is a list of dotted overrides of the recipe, written out in full (no row inherits another, so a
reader sees each row's whole difference from the recipe). Every row runs with K seeds as its own `dapo train`
process, stopping once it has sampled `budget_samples` responses (`trainer.max_generated_samples`) -- not after a
number of steps, because dynamic sampling samples several rounds per step -- and validating whenever another
`test_freq_samples` responses have been sampled (`trainer.test_freq_samples`).

Results go to `<out>/<row>/seed<k>/` (a normal run directory). A run that finished has a `DONE` file and is
skipped when the command is repeated; an interrupted one resumes from its last checkpoint. Several specs may share
`<out>` (a row of the same name and settings is run once); each writes its own report, `<out>/<spec>.md` (e.g.
`ladder.md`), the table (held-out accuracy mean and sd over seeds; generated samples to reach the reference row's final accuracy
and the spec's fixed `thresholds`;
the training dynamics at the end), and `<out>/<spec>_figures/<quantity>.png`, one figure per quantity with a line
per row.

Spec format::

    recipe: tiny_chain_steps        # a shipped recipe name or a YAML path
    budget_samples: 40960           # sampled training responses per run
    test_freq_samples: 4096         # validate every this many
    reference: grpo                 # the row whose final accuracy the others race to (default: the first)
    thresholds: [0.15, 0.17]        # optional: also the samples each row needs to reach these accuracies
    overrides: [...]                # applied to every row
    rows:
      - name: grpo
        label: GRPO (symmetric clip 0.2, seq-mean-token-mean, no overlong shaping, no filtering)
        overrides: [algorithm.clip_ratio_high=0.2, ...]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from dapo_rl.config import ConfigError, load_config

SPEC_DIR = "ablation"
"""Shipped specs live in `dapo_rl/configs/ablation/` (`configs/ablation/` at the repository root)."""

DEFAULT_SPEC = "ladder"

EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit code of `dapo ablate` (as of the `dapo train` runs it starts) stopped by SIGTERM: 143."""

QUANTITIES: tuple[tuple[str, str, str], ...] = (
    ("val_acc", "held-out accuracy", "val"),
    ("train/entropy", "entropy of the actor (nats per token)", "train"),
    ("train/response_length_mean", "response length (tokens)", "train"),
    ("train/response_clip_ratio", "truncated share of responses", "train"),
    ("train/all_correct_group_ratio", "share of all-correct groups", "train"),
    ("train/token_prob_mean", "mean probability of generated tokens", "train"),
)
"""(metric key, axis label, kind) of the figures `dapo ablate` draws against generated samples."""


@dataclass
class Row:
    """One configuration of the ablation: a name (its directory), a label, its overrides of the recipe."""

    name: str
    label: str
    overrides: list[str]


@dataclass
class Spec:
    """An ablation spec (see the module docstring); `path` is where it was read."""

    path: Path
    recipe: str
    budget_samples: int
    test_freq_samples: int
    rows: list[Row]
    reference: str
    overrides: list[str] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)
    """Fixed held-out accuracies the table gives each row's samples to reach: unlike the reference row's final
    accuracy, they stay informative when every curve still rises at the end of the budget."""


def spec_path(name: str) -> Path:
    """A spec file: a path, or the name of a shipped spec (`ladder`, `loss_variants`).

    Raises:
        ConfigError: neither exists (the message lists the shipped specs).
    """
    if os.path.exists(name):
        return Path(name)
    root = Path(str(resources.files("dapo_rl") / "configs" / SPEC_DIR))
    path = root / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in root.glob("*.yaml")))
        raise ConfigError(f"no ablation spec {name!r} (a file, or one of the shipped specs: {known})")
    return path


def load_spec(name: str) -> Spec:
    """Read and check an ablation spec.

    Raises:
        ConfigError: unreadable YAML, a missing or mistyped field, duplicate row names, an unknown reference row,
            or a row whose overrides `dapo train` would reject (each row is loaded as a config, naming the row).
    """
    from omegaconf import OmegaConf

    path = spec_path(name)
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:
        raise ConfigError(f"cannot read ablation spec {path}: {' '.join(str(e).split())}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"ablation spec {path} must be a mapping with recipe, budget_samples and rows")
    known = {"recipe", "budget_samples", "test_freq_samples", "reference", "thresholds", "overrides", "rows"}
    for key in raw:
        if key not in known:
            raise ConfigError(
                f"ablation spec {path}: unknown field {key!r} (fields: {', '.join(sorted(known))})"
            )
    for key in ("recipe", "budget_samples", "rows"):
        if key not in raw:
            raise ConfigError(f"ablation spec {path}: missing field {key!r}")
    rows = []
    for i, r in enumerate(raw["rows"] or []):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            raise ConfigError(f"ablation spec {path}: rows[{i}] needs a name (a string)")
        over = r.get("overrides") or []
        if not isinstance(over, list) or not all(isinstance(o, str) for o in over):
            raise ConfigError(
                f"ablation spec {path}: rows[{i}] ({r['name']}): overrides must be a list of key=value"
            )
        rows.append(Row(r["name"], str(r.get("label", r["name"])), list(over)))
    if not rows:
        raise ConfigError(f"ablation spec {path}: no rows")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ConfigError(f"ablation spec {path}: duplicate row names in {names}")
    budget = raw["budget_samples"]
    if not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"ablation spec {path}: budget_samples must be a positive integer, got {budget!r}")
    reference = raw.get("reference") or rows[0].name
    if reference not in names:
        raise ConfigError(f"ablation spec {path}: reference row {reference!r} is not one of {names}")
    thresholds = raw.get("thresholds")
    thresholds = [] if thresholds is None else thresholds
    if (
        not isinstance(thresholds, list)
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= 1 for t in thresholds)
        or len(set(thresholds)) != len(thresholds)
    ):
        raise ConfigError(
            f"ablation spec {path}: thresholds must be a list of distinct accuracies in (0, 1], got {thresholds!r}"
        )
    return Spec(
        path,
        str(raw["recipe"]),
        budget,
        int(raw.get("test_freq_samples") or max(budget // 10, 1)),
        rows,
        reference,
        list(raw.get("overrides") or []),
        [float(t) for t in thresholds],
    )


def run_overrides(spec: Spec, row: Row, seed: int, out_dir: Path, extra: list[str]) -> list[str]:
    """The `dapo train` overrides of one run: the spec's common ones, the row's, the budget and cadence, the seed and
    run directory, then `extra` (the command line's `--set`, applied last so a smoke test can shrink everything)."""
    return [
        *spec.overrides,
        *row.overrides,
        f"trainer.max_generated_samples={spec.budget_samples}",
        f"trainer.test_freq_samples={spec.test_freq_samples}",
        "trainer.test_freq=-1",
        "trainer.total_training_steps=1000000",
        "trainer.progress_bar=false",
        f"trainer.seed={seed}",
        f"trainer.output_dir={out_dir}",
        *extra,
    ]


def _recipe_arg(spec: Spec) -> str:
    """The recipe as `dapo train` takes it: a shipped name as is, a relative path resolved next to the spec."""
    r = spec.recipe
    if r.endswith((".yaml", ".yml")) and not os.path.isabs(r) and not os.path.exists(r):
        r = str(spec.path.parent / r)
    return r


def check_rows(spec: Spec, extra: list[str]) -> None:
    """Load every row's config before any run starts, so a typo fails in a second, naming the row.

    Raises:
        ConfigError: naming the row and the bad setting.
    """
    recipe = _recipe_arg(spec)
    for row in spec.rows:
        try:
            load_config(recipe, run_overrides(spec, row, 0, Path("unused"), extra))
        except ConfigError as e:
            raise ConfigError(f"ablation spec {spec.path}, row {row.name!r}: {e}") from e


def run_ablation(
    spec: Spec,
    out: Path,
    seeds: int,
    rows: list[str] | None = None,
    extra: list[str] | None = None,
    log=print,
) -> int:
    """Run every (row, seed) not finished yet, then write the table and the figures.

    A run is finished when `<out>/<row>/seed<k>/DONE` exists; one with a checkpoint but no `DONE` resumes; one with
    neither starts afresh (its partial directory is removed). A run that fails is reported and the others go on.

    SIGTERM is forwarded to the run in progress, which saves a checkpoint after its current step and exits
    (`dapo_rl.trainer.run`); no further run starts and no report is written: the repeated command resumes that run
    and goes on with the rest.

    Args:
        spec: the ablation (`load_spec`).
        out: the results directory.
        seeds: K: seeds 0..K-1 per row.
        rows: run only these row names (default: all).
        extra: overrides applied to every run after the spec's (`dapo ablate --set ...`).
        log: progress lines.

    Returns:
        0 when every run finished, 1 when some failed (the table then shows what did finish), `EXIT_TERMINATED`
        when SIGTERM stopped it.

    Raises:
        ConfigError: an unknown row name; a row whose config does not load; `out` holding a run of the same row
            and seed made with other settings.
    """
    extra = list(extra or [])
    chosen = [r for r in spec.rows if rows is None or r.name in rows]
    if rows is not None:
        unknown = sorted(set(rows) - {r.name for r in spec.rows})
        if unknown:
            raise ConfigError(f"--rows: {unknown} not in the spec's rows {[r.name for r in spec.rows]}")
    check_rows(spec, extra)
    recipe = _recipe_arg(spec)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    todo = [(row, seed) for row in chosen for seed in range(seeds)]
    running: list[subprocess.Popen] = []  # the run in progress
    stop = threading.Event()

    def on_sigterm(signum, frame):
        stop.set()
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    for i, (row, seed) in enumerate(todo, 1):
        if stop.is_set():
            break
        run_dir = out / row.name / f"seed{seed}"
        over = run_overrides(spec, row, seed, run_dir, extra)
        ident = {"recipe": recipe, "overrides": [o for o in over if not o.startswith("trainer.output_dir=")]}
        record = run_dir / "ablation_run.json"
        saved = json.loads(record.read_text()) if record.is_file() else None
        if saved is not None and (saved["overrides"], saved["recipe"]) != (ident["overrides"], recipe):
            raise ConfigError(
                f"{run_dir} holds a run with other settings ({saved['overrides']}); use another --out or remove it"
            )
        if (run_dir / "DONE").is_file():
            log(f"[{i}/{len(todo)}] {row.name} seed {seed}: done already, skipped")
            continue
        resume = any((run_dir / "checkpoints").glob("global_step_*"))
        prior = float(saved.get("wall_s", 0.0)) if saved is not None and resume else 0.0
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(ident | {"wall_s": prior}, indent=1))
        cmd = [sys.executable, "-m", "dapo_rl.cli", "train", recipe, *over, *(["--resume"] if resume else [])]
        log(f"[{i}/{len(todo)}] {row.name} seed {seed}: {'resuming' if resume else 'running'} -> {run_dir}")
        t0 = time.time()
        logfile = out / row.name / f"seed{seed}.log"
        with open(logfile, "a") as fh:
            running[:] = [subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)]
            if stop.is_set():  # the signal came before the handler could see this run
                running[0].send_signal(signal.SIGTERM)
            code = running[0].wait()
            running.clear()
        wall = prior + time.time() - t0
        record.write_text(json.dumps(ident | {"wall_s": wall}, indent=1))
        if code == 0:
            (run_dir / "DONE").write_text(json.dumps({"wall_s": wall, "exit_code": 0}))
            log(f"    finished in {wall / 60:.1f} min")
        elif stop.is_set():
            saved = "after saving a checkpoint" if code == EXIT_TERMINATED else f"(exit {code})"
            log(f"    stopped by SIGTERM {saved}; see {logfile}")
        else:
            failed.append(f"{row.name}/seed{seed} (exit {code}, log {logfile})")
            log(f"    FAILED with exit code {code}; see {logfile}")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
    if stop.is_set():
        log(
            "dapo ablate: stopped by SIGTERM. Run the same command again to go on: finished runs are skipped, the "
            "interrupted one resumes from its last checkpoint."
        )
        return EXIT_TERMINATED
    table = write_report(spec, out, seeds, chosen)
    log(f"table: {table}")
    if failed:
        log(f"{len(failed)} run(s) failed: {'; '.join(failed)}")
        return 1
    return 0


# ---------------------------------------------------------------------------------------------- reading results
@dataclass
class RunResult:
    """What the report reads from one run's `metrics.jsonl`: validation points and training curves against the
    cumulative number of sampled responses."""

    val: list[tuple[float, float]]
    train: dict[str, list[tuple[float, float]]]
    steps: int
    wall_s: float | None
    wasted: float | None = None
    """Response tokens sampled but never trained on, over all sampled (the run's `train/gen_tokens_wasted_ratio`)."""


def read_run(run_dir: Path) -> RunResult | None:
    """A finished run's curves (None when it has not finished: no `DONE` file, or no metrics). The validation
    accuracy is the mean of the run's `val/*/acc` keys (one held-out set in the shipped specs); step 0's validation
    sits at 0 samples."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file() or not (run_dir / "DONE").is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    val, train = [], {k: [] for k, _, kind in QUANTITIES if kind == "train"}
    steps = 0
    gen = wasted = 0.0
    for r in rows:
        if "train/gen_tokens" in r and "train/gen_tokens_wasted_ratio" in r:
            gen += r["train/gen_tokens"]
            wasted += r.get(
                "train/gen_tokens_wasted", r["train/gen_tokens"] * r["train/gen_tokens_wasted_ratio"]
            )
        x = float(r.get("train/gen_samples_total", 0.0))
        accs = [v for k, v in r.items() if k.startswith("val/") and k.endswith("/acc")]
        if accs:
            val.append((x, sum(accs) / len(accs)))
        if r.get("step", 0) > 0:
            steps = max(steps, int(r["step"]))
            for k in train:
                if k in r and r[k] is not None:
                    train[k].append((x, float(r[k])))
    wall = json.loads((run_dir / "DONE").read_text()).get("wall_s")
    return RunResult(val, train, steps, wall, wasted / gen if gen else None)


def samples_to_reach(val: list[tuple[float, float]], target: float) -> float | None:
    """Generated samples at which the validation curve first reaches `target`, interpolated linearly between
    validation points; None if it never does. `val`: `(samples, accuracy)` in sample order."""
    for (x0, y0), (x1, y1) in zip([(0.0, -math.inf), *val[:-1]], val):
        if y1 >= target:
            if y0 == -math.inf or y1 == y0:
                return x1
            return x0 + (target - y0) / (y1 - y0) * (x1 - x0)
    return None


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def _tail_mean(points: list[tuple[float, float]], budget: int, share: float = 0.1) -> float | None:
    """Mean of a training curve over its last `share` of the budget."""
    tail = [y for x, y in points if x >= (1 - share) * budget]
    return sum(tail) / len(tail) if tail else None


def _binned(points: list[tuple[float, float]], edges: list[float]) -> list[float | None]:
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        ys = [y for x, y in points if lo < x <= hi]
        out.append(sum(ys) / len(ys) if ys else None)
    return out


def write_report(spec: Spec, out: Path, seeds: int, rows: list[Row] | None = None) -> Path:
    """Write `<out>/<spec>.md` and one PNG per quantity in `<out>/<spec>_figures/` from the finished runs (unfinished or failed runs are left
    out; the table gives each row's count of finished seeds).

    Returns:
        The markdown file's path.

    Raises:
        ConfigError: `out` is not a directory (nothing was run there).
    """
    if not out.is_dir():
        raise ConfigError(
            f"{out}: no such directory, so no runs to report; run `dapo ablate {spec.path.stem} --out {out}` first"
        )
    rows = rows or spec.rows
    results = {
        row.name: [
            r for s in range(seeds) if (r := read_run(out / row.name / f"seed{s}")) is not None and r.val
        ]
        for row in rows
    }
    ref = results.get(spec.reference) or []
    ref_final = _mean_sd([r.val[-1][1] for r in ref])[0] if ref else None
    lines = [
        f"# Ablation: {spec.path.name} on `{spec.recipe}`",
        "",
        f"{spec.budget_samples} sampled training responses per run, {seeds} seed(s) per row; held-out accuracy at the "
        f"end of the budget (mean ± sd over seeds). 'Samples to {spec.reference}' is where the held-out curve first "
        f"reaches the reference row's final mean accuracy"
        + (f" ({ref_final:.3f})" if ref_final is not None else "")
        + ", interpolated between validations (every "
        f"{spec.test_freq_samples} samples), averaged over the seeds that reach it"
        + (
            "; 'samples to "
            + " / ".join(f"{t:g}" for t in spec.thresholds)
            + "' the same for fixed accuracies"
            if spec.thresholds
            else ""
        )
        + ". Entropy, length, truncation and "
        "all-correct share are means over the last 10% of the budget; 'tokens wasted' is the share of the run's sampled "
        "response tokens that no update saw (`train/gen_tokens_wasted_ratio`).",
        "",
        f"| row | held-out acc | samples to {spec.reference} (share of budget) | "
        + "".join(f"samples to {t:g} | " for t in spec.thresholds)
        + "entropy | length | truncated | all-correct groups | tokens wasted | steps | wall min | configuration |",
        "|---|---|---|" + "---|" * len(spec.thresholds) + "---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        rs = results[row.name]
        if not rs:
            lines.append(
                f"| {row.name} | (no finished run) | |{' |' * len(spec.thresholds)} | | | | | | | {row.label} |"
            )
            continue
        m, sd = _mean_sd([r.val[-1][1] for r in rs])

        def reach(target, rs=rs):
            hits = [h for r in rs if (h := samples_to_reach(r.val, target)) is not None]
            if not hits:
                return "not reached"
            hm = sum(hits) / len(hits)
            return f"{hm:,.0f} ({hm / spec.budget_samples:.0%}; {len(hits)}/{len(rs)} seeds)"

        def tail(key, rs=rs, digits=3):
            vals = [v for r in rs if (v := _tail_mean(r.train[key], spec.budget_samples)) is not None]
            return f"{sum(vals) / len(vals):.{digits}f}" if vals else ""

        walls = [r.wall_s for r in rs if r.wall_s]
        wall = f"{sum(walls) / len(walls) / 60:.1f}" if walls else ""
        steps = f"{sum(r.steps for r in rs) / len(rs):.0f}"
        wastes = [r.wasted for r in rs if r.wasted is not None]
        waste = f"{sum(wastes) / len(wastes):.1%}" if wastes else ""
        lines.append(
            f"| {row.name} | {m:.3f} ± {sd:.3f} (n={len(rs)}) | {'' if ref_final is None else reach(ref_final)} | "
            + "".join(f"{reach(t)} | " for t in spec.thresholds)
            + f"{tail('train/entropy')} | "
            f"{tail('train/response_length_mean', digits=1)} | {tail('train/response_clip_ratio')} | "
            f"{tail('train/all_correct_group_ratio')} | {waste} | {steps} | {wall} | {row.label} |"
        )
    figures = out / f"{spec.path.stem}_figures"
    lines += [
        "",
        f"Figures in `{figures.name}/`: " + ", ".join(f"`{_figure_name(k)}`" for k, _, _ in QUANTITIES),
        "",
    ]
    path = out / f"{spec.path.stem}.md"
    path.write_text("\n".join(lines))
    figures.mkdir(parents=True, exist_ok=True)
    _draw(spec, figures, rows, results)
    return path


def _figure_name(key: str) -> str:
    return key.split("/")[-1] + ".png"


def _draw(spec: Spec, out: Path, rows: list[Row], results: dict[str, list[RunResult]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = 20
    edges = [spec.budget_samples * i / bins for i in range(bins + 1)]
    centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    for key, label, kind in QUANTITIES:
        fig, ax = plt.subplots(figsize=(8, 5))
        for row in rows:
            rs = results[row.name]
            if not rs:
                continue
            if (
                kind == "val"
            ):  # validations sit at (about) the same sample counts in every seed: average by index
                k = min(len(r.val) for r in rs)
                xs = [sum(r.val[i][0] for r in rs) / len(rs) for i in range(k)]
                per_seed = [[r.val[i][1] for i in range(k)] for r in rs]
            else:
                xs = centres
                per_seed = [_binned(r.train[key], edges) for r in rs]
            ys, lo, hi, xk = [], [], [], []
            for i, x in enumerate(xs):
                vals = [s[i] for s in per_seed if s[i] is not None]
                if vals:
                    xk.append(x)
                    ys.append(sum(vals) / len(vals))
                    lo.append(min(vals))
                    hi.append(max(vals))
            if not ys:
                continue
            (line,) = ax.plot(xk, ys, marker="o" if kind == "val" else None, label=row.name)
            if len(rs) > 1:
                ax.fill_between(xk, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("generated samples (training responses)")
        ax.set_ylabel(label)
        ax.set_title(f"{label}: mean over seeds (band: min-max)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / _figure_name(key), dpi=100)
        plt.close(fig)
