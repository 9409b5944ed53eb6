"""How `dapo train` stops on a signal, and what it says then.

SIGTERM (a scheduler's preemption or time limit, `timeout`, torchrun forwarding it) stops the run at the next step
boundary: the step in progress finishes, the ranks agree on the stop (`Trainer.stop_requested`, an all-reduce), a
checkpoint is saved, and the run exits with `EXIT_TERMINATED` and the command that resumes (`resume_command`).
Ctrl-C (SIGINT) does the same once (`EXIT_INTERRUPTED`); pressed again it quits at once, without a checkpoint of the
step in progress, naming the newest checkpoint (`CtrlC`, `say_interrupted`). Before training begins either signal
ends the run with a line saying there is nothing to save. Child processes (reward workers, engine processes)
ignore both: the trainer ends them (`dapo_rl.children`).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from dapo_rl.checkpoint import latest_checkpoint
from dapo_rl.distributed import launched_rank

EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit code of `dapo train` stopped by SIGTERM after saving a checkpoint: 143, what a shell reports for a process
ended by SIGTERM, so that a scheduler or a script does not take the run as finished (Slurm's `afterok`, a pipeline's
next stage) while the message says where the checkpoint is and how to resume."""

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""Exit code of `dapo train` stopped by Ctrl-C (SIGINT): 130, what a shell reports for a process ended by SIGINT;
after saving a checkpoint (one Ctrl-C) or at once, without one for the step in progress (a second Ctrl-C)."""


class TrainingStopped(Exception):
    """SIGTERM or Ctrl-C (`signum`) stopped the run at a step boundary, after `checkpoint` (the step's checkpoint)
    was written; `exit_code` is `EXIT_TERMINATED` or `EXIT_INTERRUPTED`."""

    def __init__(self, step: int, checkpoint: Path, signum: int = signal.SIGTERM):
        what = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
        super().__init__(f"stopped by {what} after step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint = step, checkpoint
        self.exit_code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED


class Interrupted(KeyboardInterrupt):
    """Ctrl-C before training began, or a second Ctrl-C: `run` quits at once (a KeyboardInterrupt, so that no
    ``except Exception`` on the way swallows it)."""


def resume_command(command: list[str] | None, external_launcher: bool) -> str:
    """The command that resumes a stopped run: `dapo <command> --resume` (`command`: the `dapo` arguments the run
    was started with), under the user's own launcher `torchrun ... -m dapo_rl.cli <command> --resume`; without
    `command` (Ray Train workers), a sentence saying to repeat it."""
    if command is None:
        return "the same command with --resume"
    args = shlex.join([*command, *([] if "--resume" in command else ["--resume"])])
    return f"torchrun <the same options> -m dapo_rl.cli {args}" if external_launcher else f"dapo {args}"


def catch_sigterm(trainer, is_main: bool):
    """From here on, SIGTERM sets `trainer.stop_signal` instead of ending the process (`Trainer.fit` stops at the
    next step boundary; `is_main`: this rank says so); a repeated SIGTERM, or one after a Ctrl-C, changes nothing,
    except in a rank of torch's elastic launcher (torchrun, `trainer.nproc_per_node`): the ranks run in a session of
    their own, the terminal's Ctrl-C reaches the launcher alone, and the launcher forwards the first press as SIGINT
    and turns the second into SIGTERM, which then counts as the second Ctrl-C (`CtrlC`). Returns the handler to
    restore, or None off the main thread (where Python cannot set one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigterm(signum, frame):
        if trainer.stop_signal == signal.SIGINT and "TORCHELASTIC_RUN_ID" in os.environ:
            ctrl_c = signal.getsignal(signal.SIGINT)
            if isinstance(ctrl_c, CtrlC):
                ctrl_c(signal.SIGINT, frame)  # the launcher's second Ctrl-C: quit at once
                return
        if trainer.stop_signal:  # a stop asked for already (a Ctrl-C, or SIGTERM): the same stop
            return
        trainer.stop_signal = signal.SIGTERM
        if is_main:  # os.write: safe inside a signal handler, unlike print
            os.write(
                2,
                b"dapo train: SIGTERM received: stopping after the step in progress, with a checkpoint\n",
            )

    return signal.signal(signal.SIGTERM, on_sigterm)


def say_sigterm_at_startup():
    """Until `fit` takes SIGTERM over (a checkpoint at the next step boundary), SIGTERM ends the process as before,
    but says so first: a run stopped while it builds its model, engine or data has nothing to save. Returns the
    handler to restore, or None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigterm(signum, frame):
        if launched_rank() == 0:  # os.write: safe inside a signal handler, unlike print
            os.write(
                2, b"dapo train: SIGTERM during start-up, before training began: stopped, nothing to save\n"
            )
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ended by the signal, as without this handler (exit status 143)

    return signal.signal(signal.SIGTERM, on_sigterm)


class CtrlC:
    """`dapo_rl.trainer.run`'s SIGINT handler, as verl, TRL and torchtitan users expect it. Before training begins a
    Ctrl-C quits (nothing to save). Once `trainer` is set (anything with a `stop_signal` attribute: the `Trainer`),
    the first Ctrl-C asks for a stop at the next step boundary with a checkpoint, as SIGTERM does (`stop_signal`); the next one raises `Interrupted` in the main thread, so
    the run quits at once. Once `closing` is set (the run's own teardown, every wait of which has a deadline),
    Ctrl-C is ignored, so that teardown finishes and leaves no child process. Under torch's elastic launcher the
    second press arrives as SIGTERM (`catch_sigterm`).
    """

    def __init__(self):
        self.trainer = None
        self.first: float | None = None  # time.monotonic() of the first Ctrl-C
        self.closing = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # Python sets handlers there alone
            self.previous = signal.signal(signal.SIGINT, self)

    def __call__(self, signum, frame) -> None:
        now = time.monotonic()
        if self.closing:
            return
        if self.first is None and self.trainer is not None:
            self.first = now
            if not self.trainer.stop_signal:
                self.trainer.stop_signal = signal.SIGINT
            if launched_rank() == 0:  # os.write: safe inside a signal handler, unlike print
                os.write(
                    2,
                    b"dapo train: Ctrl-C: stopping after the step in progress, with a checkpoint; "
                    b"press Ctrl-C again to quit at once\n",
                )
            return
        self.first = self.first or now
        self.closing = True
        raise Interrupted()

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def say_interrupted(e: Interrupted, where: tuple[Path, int] | None, resume_hint: str) -> None:
    """Rank 0's line for a run that `Interrupted` ended: before training began (`where` None), or a second Ctrl-C
    (`where`: the run directory and the step in progress; after the stop's checkpoint, when the first Ctrl-C's stop
    had written it already)."""
    if where is None:
        print(
            "dapo train: Ctrl-C during start-up, before training began: stopped, nothing to save",
            file=sys.stderr,
        )
        return
    if isinstance(e.__context__, TrainingStopped):  # the stop's checkpoint is written; its teardown was cut
        print(f"dapo train: {e.__context__}. To continue from it: {resume_hint}", file=sys.stderr, flush=True)
        return
    out, step = where
    ckpt = latest_checkpoint(out)
    newest = (
        f"the newest checkpoint is {ckpt}. To continue from it: {resume_hint}"
        if ckpt is not None
        else "there is no checkpoint to continue from"
    )
    print(
        f"dapo train: Ctrl-C again: quit at once, without a checkpoint of the step in progress (step "
        f"{step}); {newest}",
        file=sys.stderr,
        flush=True,
    )
