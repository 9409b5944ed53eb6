"""Fault injection for the crash tests, kept out of the product.

A `dapo train` child (and each of its torchrun ranks) started with this folder first on `PYTHONPATH` and
`DAPO_RL_FAULT_AT` set imports this file at start-up (Python's `site` imports `sitecustomize`; `tests/e2e.py`'s
`dapo` sets both). When `dapo_rl.trainer` is then imported, the real functions at the named points are wrapped, so
that the process SIGKILLs itself, or trains on NaN advantages, there:

`DAPO_RL_FAULT_AT`: a comma-separated list of `<point>:<step>` or `<point>:<step>@<rank>` (only that rank), with
`<point>` one of
- `rollout`: the step's responses generated, not yet scored (the engine that `collect_batch` is given returns from
  `generate` / `generate_chat`, or its `generate_chunks` runs out);
- `update`: the optimizer steps taken (`Actor.update` returned), the engine not yet synced, nothing written;
- `checkpoint`: the model written to the checkpoint's temporary directory (`Actor.save` returned inside
  `Trainer.save_checkpoint`), the trainer state not yet;
- `nan_loss`: the step's advantages (`make_train_batch`'s batch) are NaN, so its loss is NaN;
- `error`: where `update` kills, an uncaught `RuntimeError` is raised instead (an out-of-memory error, a full disk).

A malformed list stops the process at start-up (exit code 70) with a message; a point that cannot be wrapped (a
renamed function) fails the import of `dapo_rl.trainer`. Either way the crash test sees no SIGKILL and fails, as it
does if this file is not imported at all. This file shadows any other `sitecustomize` on the path (this project's
environment has none).
"""

import functools
import importlib.abc
import importlib.util
import os
import re
import signal
import sys

FAULT_ENV = "DAPO_RL_FAULT_AT"
POINTS = ("rollout", "update", "checkpoint", "nan_loss", "error")
_ITEM = re.compile(rf"({'|'.join(POINTS)}):(\d+)(@\d+)?")


def parse_faults(spec: str) -> set[str]:
    """The items of a `DAPO_RL_FAULT_AT` value (spaces around commas ignored).

    Raises:
        ValueError: an item that is not `<point>:<step>` or `<point>:<step>@<rank>` with a known point.
    """
    items = {x.strip() for x in spec.split(",") if x.strip()}
    bad = sorted(x for x in items if not _ITEM.fullmatch(x))
    if bad:
        raise ValueError(f"{FAULT_ENV}: {bad} not of the form <point>:<step>[@<rank>], point one of {POINTS}")
    return items


def fault_at(faults: set[str], point: str, step: int, rank: int) -> bool:
    """Whether `faults` asks for `point` at this step on this rank."""
    return f"{point}:{step}" in faults or f"{point}:{step}@{rank}" in faults


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillAfterGenerating:
    """An engine that SIGKILLs the process once a round's responses are generated; otherwise the engine itself
    (attributes it lacks stay missing, so `hasattr(engine, "generate_chat")` answers as for the engine)."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if name in ("generate", "generate_chat"):

            def generate(*args, **kwargs):
                out = attr(*args, **kwargs)
                _kill()
                return out

            return generate
        if name == "generate_chunks":

            def chunks(*args, **kwargs):
                yield from attr(*args, **kwargs)
                _kill()

            return chunks
        return attr


def install(trainer_module, faults: set[str]) -> None:
    """Wrap the points of `faults` in the freshly imported `dapo_rl.trainer` (and `dapo_rl.actor.Actor`)."""
    import torch

    from dapo_rl.actor import Actor

    trainer_cls = trainer_module.Trainer
    # the step and rank while `Trainer.train_step` or `Trainer.save_checkpoint` runs
    where: dict[str, int] = {}

    def at(point: str) -> bool:
        return bool(where) and fault_at(faults, point, where["step"], where["rank"])

    def during(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            where.update(step=self.step, rank=self.ctx.rank)
            try:
                return method(self, *args, **kwargs)
            finally:
                where.clear()

        return wrapper

    trainer_cls.train_step = during(trainer_cls.train_step)
    trainer_cls.save_checkpoint = during(trainer_cls.save_checkpoint)

    collect_batch = trainer_module.collect_batch

    @functools.wraps(collect_batch)
    def collect_batch_(engine, *args, **kwargs):
        return collect_batch(_KillAfterGenerating(engine) if at("rollout") else engine, *args, **kwargs)

    make_train_batch = trainer_module.make_train_batch

    @functools.wraps(make_train_batch)
    def make_train_batch_(*args, **kwargs):
        batch = make_train_batch(*args, **kwargs)
        if at("nan_loss"):
            batch.advantages = torch.full_like(batch.advantages, float("nan"))
        return batch

    update, save = Actor.update, Actor.save

    @functools.wraps(update)
    def update_(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        if at("update"):
            _kill()
        if at("error"):
            raise RuntimeError("injected fault: an error after the update (tests/faultinject)")
        return out

    @functools.wraps(save)
    def save_(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if at("checkpoint"):
            _kill()

    trainer_module.collect_batch = collect_batch_
    trainer_module.make_train_batch = make_train_batch_
    Actor.update, Actor.save = update_, save_


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Finds `dapo_rl.trainer` as the import system would, and runs `install` once its module has executed."""

    def __init__(self, faults: set[str]):
        self.faults = faults

    def find_spec(self, fullname, path, target=None):
        if fullname != "dapo_rl.trainer":
            return None
        sys.meta_path.remove(self)  # once, and not in the search below
        spec = importlib.util.find_spec(fullname)
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            install(module, self.faults)

        spec.loader.exec_module = exec_module
        return spec


def _arm() -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    try:
        faults = parse_faults(spec)
    except ValueError as e:
        print(f"tests/faultinject: {e}", file=sys.stderr)
        os._exit(70)
    sys.meta_path.insert(0, _InstallOnImport(faults))


_arm()
