"""Checkpoints of a run: `checkpoints/global_step_N/` written through a temporary directory renamed into place.

```
global_step_N/
  model/              Hugging Face checkpoint (full weights, tokenizer): from_pretrained and vLLM load it; under
                      LoRA (`actor.lora`) the merged weights, in the run's last checkpoint only (`dapo export`
                      writes it for any other)
  adapter/            LoRA only: the adapters in PEFT's format (PeftModel.from_pretrained loads it on the base)
  dcp/                torch.distributed.checkpoint of model, optimizer and scheduler (sharded, reshardable); under
                      LoRA of the adapters and their optimizer state only (megabytes)
  rng_rank<r>.pt      every RNG of rank r
  trainer_state.pt    step, bad-step streak, sampler position, world size (written last: its presence marks a
                      complete checkpoint)
```
Every rank takes part (the weights are sharded); rank 0 writes the index and prunes old checkpoints. Under several
machines `trainer.output_dir` must be on a filesystem they all see.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from dapo_rl.config import ConfigError
from dapo_rl.distributed import DistContext, barrier, broadcast_object


def rng_state() -> dict:
    """Every global RNG, as plain lists and tensors (loadable with `torch.load(weights_only=True)`)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out = {
        "python": [version, list(mt), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the rows of a `metrics.jsonl` up to `step` (a resume rewrites the later ones), atomically.

    A line cut short by a crash, or any line that is not a JSON object with an integer `step`, is dropped.

    Returns:
        The number of rows kept.
    """
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(row)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return len(keep)


def _step_of(p: Path) -> int:
    return int(p.name.rsplit("_", 1)[1])


def _step_dirs(root: Path) -> list[Path]:
    """`root`'s `global_step_<N>` entries (N all digits: a copy such as `global_step_10_copy` is no checkpoint)."""
    return [p for p in root.glob("global_step_*") if p.name.removeprefix("global_step_").isdigit()]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/global_step_N` directory of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = [p for p in _step_dirs(root) if (p / "trainer_state.pt").is_file()]
    return max(done, key=_step_of, default=None)


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """The `checkpoints/global_step_N` directories newer than `latest_checkpoint` that have no `trainer_state.pt`
    (oldest first). A checkpoint is written under a temporary name and renamed whole, so such a directory was
    damaged after it was written (its `trainer_state.pt` removed or lost); resuming passes over it."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    newest = latest_checkpoint(run_dir)
    floor = _step_of(newest) if newest is not None else -1
    dirs = [p for p in _step_dirs(root) if p.is_dir() and not (p / "trainer_state.pt").is_file()]
    return sorted((p for p in dirs if _step_of(p) > floor), key=_step_of)


def save_checkpoint(
    run_dir: Path,
    step: int,
    actor,
    tokenizer,
    trainer_state: dict,
    ctx: DistContext,
    keep: int = 0,
    export_model: bool = True,
) -> Path:
    """Write `checkpoints/global_step_<step>/` (a collective: every rank calls it) and prune old ones.

    Args:
        run_dir: the run directory.
        step: the RL step.
        actor: `Actor` (writes `model/` and `dcp/`).
        tokenizer: saved beside the model.
        trainer_state: the loop's own state (step, streak, sampler, ...), written by rank 0.
        ctx: this rank.
        keep: newest checkpoints to keep (0 or less: all).
        export_model: write `model/` (a LoRA actor writes it only when asked; a full one always does).

    Raises:
        NonFiniteWeights: the weights hold NaN or inf; nothing new becomes a checkpoint.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"global_step_{step}"
    tmp = root / f".tmp_global_step_{step}"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(ctx)
    actor.save(tmp, export_model=export_model)
    if ctx.is_main and (tmp / "model").is_dir():
        tokenizer.save_pretrained(tmp / "model")
    torch.save(rng_state(), tmp / f"rng_rank{ctx.rank}.pt")
    barrier(ctx, checkpoint=True)  # rank 0 may still be writing model/
    if ctx.is_main:
        torch.save({**trainer_state, "world_size": ctx.world_size}, tmp / "trainer_state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
        if keep > 0:
            for old in sorted(_step_dirs(root), key=_step_of)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier(ctx)
    return final


PROBLEM_CHARS = 200
"""A load error's first line is shortened to about this many characters (at a word boundary) in the message."""


def _short(e: BaseException, limit: int = PROBLEM_CHARS) -> str:
    """``Type: first line of the message``, the line shortened at a space to at most `limit` characters (+ "...")."""
    lines = str(e).strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) > limit:
        cut = line.rfind(" ", 0, limit + 1)
        line = (line[:cut] if cut > 0 else line[:limit]).rstrip(" ,;:") + " ..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file, read from its header alone: the 8-byte header length, the JSON
    header, and the file's size equal to where the header says its last tensor ends (a cut copy fails here).

    Returns:
        None when the header and size agree; else what is wrong (without the file's name).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{size} bytes: no header"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return f"{size} bytes, the header alone needs {8 + n}"
            header = json.loads(fh.read(n))
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        return f"unreadable header ({_short(e)})"
    if size != 8 + n + end:
        return f"{size} bytes, the header needs {8 + n + end}"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint's files, read without loading any tensor: `trainer_state.pt` and each
    `rng_rank<r>.pt` must load, each ``.safetensors`` file of `model/` and `adapter/` must be as long as its header
    says (`safetensors_problem`), and every byte range `dcp/.metadata` names must lie inside its file (a file cut
    short by a full disk or a killed copy fails here). Bytes overwritten in place, the size kept, pass: there are
    no checksums.

    Args:
        ckpt: a `checkpoints/global_step_N` directory.

    Returns:
        None when intact; else one line naming the file and what is wrong with it.
    """
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = Path(ckpt)
    for f in [ckpt / "trainer_state.pt", *sorted(ckpt.glob("rng_rank*.pt"))]:
        try:
            torch.load(f, weights_only=True)
        except Exception as e:  # noqa: BLE001 (any failure to read it is the answer)
            return f"{f}: {_short(e)}"
    for f in sorted([*ckpt.glob("model/*.safetensors"), *ckpt.glob("adapter/*.safetensors")]):
        problem = safetensors_problem(f)
        if problem is not None:
            return f"{f}: {problem}"
    dcp_dir = ckpt / "dcp"
    try:
        meta = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as e:  # noqa: BLE001
        return f"{dcp_dir / '.metadata'}: {_short(e)}"
    ends: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        f = dcp_dir / name
        size = f.stat().st_size if f.is_file() else -1
        if size < end:
            return f"{f}: {'missing' if size < 0 else f'{size} bytes, the metadata needs {end}'}"
    return None


def intact_before(ckpt: Path) -> Path | None:
    """The newest checkpoint of the same run older than `ckpt` whose files are intact (`checkpoint_problem`)."""
    older = [
        p
        for p in _step_dirs(Path(ckpt).parent)
        if (p / "trainer_state.pt").is_file() and _step_of(p) < _step_of(Path(ckpt))
    ]
    for p in sorted(older, key=_step_of, reverse=True):
        if checkpoint_problem(p) is None:
            return p
    return None


_DAMAGE_WORDS = (
    "PytorchStreamReader",
    "central directory",
    "invalid header",
    "unexpected EOF",
    "truncated",
    "corrupt",
)


def _reads_as_damage(e: BaseException) -> bool:
    """Whether a load error is what a damaged file raises (a cut or garbled pickle, zip archive or tensor file),
    rather than a mismatch or a lack of memory."""
    import pickle
    import zipfile

    if isinstance(e, (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, UnicodeDecodeError)):
        return True
    return isinstance(e, (RuntimeError, ValueError, OSError)) and any(w in str(e) for w in _DAMAGE_WORDS)


def damaged_checkpoint_error(ckpt: Path, problem: str) -> ConfigError:
    """The one-line error for a damaged checkpoint: `problem` (naming the file) and the newest intact checkpoint to
    resume from instead (`intact_before`), with the command that moves the damaged one aside."""
    good = intact_before(ckpt)
    advice = (
        f"the newest intact checkpoint is {good}: move the damaged one aside "
        f"(mv {ckpt} {Path(ckpt).parent.parent / ('damaged_' + Path(ckpt).name)}) and resume again"
        if good is not None
        else "no older intact checkpoint: start the run again"
    )
    return ConfigError(f"checkpoint {ckpt} is damaged ({problem}); {advice}")


def check_resumable(ckpt: Path, ctx: DistContext | None = None) -> None:
    """Refuse a damaged checkpoint (`checkpoint_problem`) before anything loads from it (the engine reads
    `model/` before the actor reads `dcp/`). Rank 0 reads the files (every rank's `rng_rank*.pt` among them: once,
    not once per rank) and every rank gets its answer (a collective).

    Raises:
        ConfigError: `damaged_checkpoint_error`, on every rank alike. A checkpoint of an older dapo-rl (no `dcp/`) is
            left to `load_checkpoint`, which says so.
    """
    ctx = ctx or DistContext()
    message = None
    if ctx.rank == 0:
        try:  # whatever happens here, the other ranks must not wait in the broadcast for nothing
            if (Path(ckpt) / "dcp").is_dir() and (problem := checkpoint_problem(ckpt)) is not None:
                message = str(damaged_checkpoint_error(ckpt, problem))
        except Exception as e:  # noqa: BLE001 (an unreadable directory: named)
            message = f"checkpoint {ckpt} cannot be checked ({type(e).__name__}: {e})"
    message = broadcast_object(message, ctx)
    if message is not None:
        raise ConfigError(message)


def load_checkpoint(ckpt: Path, actor, ctx: DistContext) -> dict:
    """Restore the actor and this rank's RNG from a checkpoint; return the loop's state (`trainer_state.pt`). The
    caller has checked its files with `check_resumable` before anything read them (the trainer does, before its
    engine reads `model/`), so they are not read twice here.

    A rank the checkpoint has no RNG state for (it was written by fewer ranks) keeps the generators it was seeded
    with; `trainer_state["world_size"]` says how many ranks wrote it.

    Raises:
        ConfigError: a checkpoint of an older dapo-rl (no `dcp/`), or a damaged one that fails to load the way
            damaged files do (bytes `check_resumable` cannot see): the message names the
            file (for a load error inside `dcp/`, that folder) and the newest intact checkpoint to resume from
            instead. Other load errors (a shape mismatch, an out-of-memory error) are raised as they are.
    """
    ckpt = Path(ckpt)
    where = ckpt / "dcp"
    try:
        actor.load(ckpt)
        where = ckpt / "trainer_state.pt"
        state = torch.load(where, weights_only=True)
        where = ckpt / f"rng_rank{ctx.rank}.pt"
        if where.is_file():
            set_rng_state(torch.load(where, weights_only=True))
        return state
    except Exception as e:
        # a mismatch, no memory: not the files' fault
        if isinstance(e, ConfigError) or not _reads_as_damage(e):
            raise
        raise damaged_checkpoint_error(ckpt, f"{where}: {_short(e)}") from e
