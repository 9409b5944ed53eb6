"""Fixtures shared by the test files that run the real `dapo` command.

Under pytest-xdist (the README's `pytest -q -n 2 --dist loadfile`), each worker and the processes its tests start
get one torch thread (`OMP_NUM_THREADS=1`, unless set already): two torch jobs of two threads each on two cores
slow each other down many times over (a warm-up beside a vLLM run: 0.58 -> 5.5 s a step), while two of one thread
each do more together than one of two (two warm-ups: 1.48 steps/s against 1.09, 2026-12-07). `base_model` is built
once for all workers.
"""

import os
import sys
from pathlib import Path

import pytest
from e2e import dapo

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:  # imported before this file: it read OMP_NUM_THREADS already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def shared_dir(tmp_path_factory) -> Path:
    """A directory that every xdist worker of this session sees: the controller's base temp, whose `popen-gwN`
    folders are the workers' (the session's own base temp without xdist or with other kinds of workers)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER and base.name.startswith("popen-") else base


@pytest.fixture(scope="session")
def base_model(tmp_path_factory):
    """A short supervised warm-up of the embedded recipe (the real `dapo sft`), shared by the tests (built by the
    first xdist worker that asks; the others wait on the lock and take it)."""
    from filelock import FileLock

    root = shared_dir(tmp_path_factory)
    out = root / "base" / "model"
    with FileLock(str(root / "base.lock")):
        if not (out / "config.json").is_file():
            r = dapo("sft", "tiny_chain_sum", "sft.steps=250", "sft.task.size=20000", f"sft.output_dir={out}")
            assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The embedded tiny model (random weights, seed 3) and its tokenizer, saved as a Hugging Face checkpoint (test
    files that need another model define their own `model_dir`)."""
    from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(seed=3).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path
