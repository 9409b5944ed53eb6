"""The `dapo` command: `dapo train`, `dapo sft`, `dapo plot`.

Exit codes: 0 success; 2 bad configuration or data (one-line message, no traceback); 3 dynamic sampling could not
fill a batch within `algorithm.filter_groups.max_num_gen_batches` rounds.
"""

from __future__ import annotations

import argparse
import sys

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dapo", description="DAPO reinforcement learning for reasoning language models."
    )
    sub = p.add_subparsers(dest="command", required=True)
    tr = sub.add_parser(
        "train",
        help="train with DAPO",
        description="Train with DAPO. With no recipe, runs the embedded default (tiny model, reasoning-gym chain_sum).",
    )
    tr.add_argument(
        "recipe", nargs="?", help="YAML recipe file or shipped recipe name (default: tiny_chain_sum)"
    )
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.clip_ratio_high=0.28")
    tr.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in trainer.output_dir"
    )
    sf = sub.add_parser("sft", help="build the embedded base model (supervised warm-up)")
    sf.add_argument("recipe", nargs="?", help="YAML recipe (its sft: section is used)")
    sf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=500 sft.output_dir=base")
    pl = sub.add_parser("plot", help="draw training_dynamics.png from a run's metrics.jsonl")
    pl.add_argument("run_dir")
    return p


def _split_recipe(args) -> tuple[str | None, list[str]]:
    """`dapo train a=b` has no recipe: the first positional is then an override."""
    if args.recipe is not None and "=" in args.recipe:
        return None, [args.recipe, *args.overrides]
    return args.recipe, list(args.overrides)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from dapo_rl.config import ConfigError, load_config
    from dapo_rl.data import DataError

    try:
        if args.command == "plot":
            from pathlib import Path

            from dapo_rl.plotting import plot_training_dynamics

            run = Path(args.run_dir)
            if not (run / "metrics.jsonl").is_file():
                raise ConfigError(f"{run}: no metrics.jsonl (is it a run directory?)")
            print(plot_training_dynamics(run / "metrics.jsonl", run / "training_dynamics.png"))
            return 0
        recipe, overrides = _split_recipe(args)
        cfg = load_config(recipe, overrides)
        if args.command == "sft":
            from dapo_rl.sft import run_sft

            run_sft(cfg.sft)
            return 0
        from tqdm import tqdm

        from dapo_rl.trainer import EXIT_DYNAMIC_SAMPLING_EXHAUSTED, DynamicSamplingExhausted, Trainer

        trainer = Trainer(cfg, resume=args.resume, log=tqdm.write)
        print(f"dapo train: run directory {trainer.out}", flush=True)
        try:
            trainer.fit()
        except DynamicSamplingExhausted as e:
            print(f"dapo train: stopped at step {trainer.step}: {e}", file=sys.stderr)
            return EXIT_DYNAMIC_SAMPLING_EXHAUSTED
        print(
            f"dapo train: done. metrics: {trainer.metrics_path}  plot: {trainer.out / 'training_dynamics.png'}"
        )
        return 0
    except (ConfigError, DataError) as e:
        print(f"dapo: error: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
