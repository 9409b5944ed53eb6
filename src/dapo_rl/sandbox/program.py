"""The program sandbox: runs model-written Python programs, each in a confined process, and reads back what they print.

`ProgramRunner` keeps `num_workers` template processes (`dapo_rl.sandbox.program_template`). Each is a fresh
interpreter started with ``python -I`` (no ``PYTHON*`` variables, no user site), a scrubbed environment (``PATH``,
``LANG``, ``TMPDIR`` only), no inherited descriptors and a session of its own: a program's process never held the
trainer's environment, memory or files. A template enters a user, network, mount, IPC and PID namespace once (it is
pid 1 of the PID namespace), makes its mount tree read-only and nosuid, then forks one child per program
(`dapo_rl.sandbox.program_template`); the child confines itself before the program's first line:

- **limits**: address space, file size, open files (``setrlimit``), CPU seconds (SIGXCPU, then SIGKILL a second
  later), wall seconds (the template's SIGKILL), kept output (`ProgramLimits`);
- **files**: reads only under the Python installation and its working directory (a fresh tmpfs of
  `ProgramLimits.disk_bytes` and `ProgramLimits.disk_files` per call, unmounted after it), writes only there, no
  exec (Landlock); no changes to any file's mode, owner, times or attributes (seccomp; the read-only mount tree);
- **network**: none (the template's network namespace has only a down loopback; seccomp fails ``socket``,
  ``connect`` and io_uring; Landlock denies TCP);
- **processes**: no fork, no exec, no signals to or limits of other processes, no ptrace (seccomp; Landlock's
  signal scope);
- **isolation**: the template's PID and IPC namespaces: the program can name no process outside, and nothing it
  made outlives its call (the template kills what is left in its namespace) or its template (the kernel does).

Which layers the OS gave is in `ProgramRunner.layers`; the missing ones are named in one warning at start
(``rlimits only`` when neither Landlock nor seccomp is available) and in `ProgramRunner.missing`.

What a program did is classified by the template from what it saw (`ProgramResult.status`); a program's exit code
is never trusted, and nothing a program does can make its result a ``sandbox_error``. A template that dies, answers
late or sends something malformed costs its call a ``sandbox_error`` and is replaced; so is one that could not
clean up after a call (it answers, and says so: ``retire``). `dapo sandbox -c CODE` runs one program exactly this
way (`run_cli`).
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from dapo_rl import children

STATUSES = ("ok", "error", "timeout", "killed", "sandbox_error")
"""What became of a program: ``ok`` (ran to its end), ``error`` (raised, exited with a non-zero ``SystemExit``,
or ended without reporting), ``timeout`` (past its wall time: killed), ``killed`` (ended by a signal: the CPU limit's
SIGXCPU or SIGKILL), ``sandbox_error`` (the sandbox failed; the program's fault is unknown)."""

READY_TIMEOUT_S = 60.0
"""Seconds a new template may take to start, enter its namespaces and run its empty probe program."""

GRACE_S = 5.0
"""Seconds past a program's wall time the runner waits for its template's answer (the template kills the program at
the wall time itself)."""

MAX_START_FAILURES = 3
"""Templates that may fail to start in a row in one place before the runner stops replacing it."""

_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from dapo_rl.sandbox.program_template import main; main()"
)
"""The template's command (``python -I`` ignores ``PYTHONPATH``: the directory holding `dapo_rl` comes as an
argument)."""


@dataclass(frozen=True)
class ProgramLimits:
    """What one program may use.

    Attributes:
        wall_s: wall-clock seconds from its start to its exit; past it the program is killed (status ``timeout``).
        cpu_s: CPU seconds (rounded up to whole seconds, at least 1); past it SIGXCPU ends it (status ``killed``),
            SIGKILL one CPU second later.
        memory_bytes: address space (``RLIMIT_AS``), bytes; an allocation past it raises ``MemoryError``.
        output_bytes: bytes of stdout and of stderr (each) kept; the rest is read and dropped, and the result says
            ``truncated``.
        file_bytes: largest file it may write in its working directory (``RLIMIT_FSIZE``), bytes.
        open_files: open file descriptors (``RLIMIT_NOFILE``).
        disk_bytes: all that one program may write, bytes: the size of the tmpfs that is its working directory
            (fresh for each call, unmounted after it). Without a mount namespace only `file_bytes` per file bounds
            it.
        disk_files: files and directories one program may make (the tmpfs's inodes).
    """

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 1 << 30
    output_bytes: int = 16 << 10
    file_bytes: int = 16 << 20
    open_files: int = 64
    disk_bytes: int = 64 << 20
    disk_files: int = 10_000

    def __post_init__(self):
        for name in ("wall_s", "cpu_s"):
            v = getattr(self, name)
            if not 0 < v < math.inf:
                raise ValueError(f"{name}={v} must be a finite number > 0")
        for name in ("memory_bytes", "output_bytes", "file_bytes", "open_files", "disk_bytes", "disk_files"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


@dataclass
class ProgramResult:
    """What one program did, as its template saw it.

    Attributes:
        status: one of `STATUSES`.
        stdout: its standard output, the first `ProgramLimits.output_bytes` bytes, decoded as UTF-8 (invalid bytes
            replaced).
        stderr: its standard error, the same way (a traceback as Python prints it when it raised).
        truncated: stdout or stderr was longer than the cap.
        wall_s: seconds from its start to its end (kill included), measured by the template.
        detail: why, in words: ``raised ZeroDivisionError``, ``exit status 3``, the signal's name (``SIGXCPU``),
            ``exited without a report (...)``, the sandbox's failure; empty for ``ok``.
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    wall_s: float = 0.0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-able dict (its fields)."""
        return asdict(self)


def sandbox_error(detail: str, wall_s: float = 0.0) -> ProgramResult:
    """The result of a call the sandbox failed."""
    return ProgramResult("sandbox_error", wall_s=wall_s, detail=detail)


def _result(obj: Any, limits: ProgramLimits) -> ProgramResult:
    """A template's result line, checked field by field (ValueError when it is not one); its optional ``retire``
    (the template can take no more calls: `ProgramRunner._answer`) is not part of the result."""
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    obj = {k: v for k, v in obj.items() if k != "retire"}
    fields = {
        "status": str,
        "stdout": str,
        "stderr": str,
        "truncated": bool,
        "wall_s": (int, float),
        "detail": str,
    }
    if set(obj) != set(fields) or not all(isinstance(obj[k], t) for k, t in fields.items()):
        raise ValueError("not a result")
    if obj["status"] not in STATUSES:
        raise ValueError(f"unknown status {obj['status']!r}")
    for k in ("stdout", "stderr"):
        if len(obj[k].encode("utf-8", "surrogatepass")) > 3 * limits.output_bytes:  # U+FFFD is 3 bytes
            raise ValueError(f"{k} over the cap")
    return ProgramResult(**obj)


def _write_all(fd: int, data: bytes, timeout_s: float) -> None:
    """Write `data` to a non-blocking pipe within `timeout_s` seconds (OSError or TimeoutError otherwise)."""
    view, deadline = memoryview(data), time.monotonic() + timeout_s
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the sandbox template did not read its request")
        _, writable, _ = select.select([], [fd], [], remaining)
        if writable:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                pass


class _Template:
    """One template process and the runner's view of it: starting (no ready line yet), idle, or busy with `job`."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the directory holding dapo_rl
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": tempfile.gettempdir()}
        self.workroot = tempfile.mkdtemp(prefix="dapo-sandbox-")  # the template mounts each call's tmpfs here
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, root, str(os.getpid()), self.workroot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
        children.register(self)
        self.fd = self.proc.stdout.fileno()
        self.stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        os.set_blocking(self.stdin_fd, False)
        self.buf = bytearray()
        self.ready = False
        self.layers: dict[str, bool] = {}
        self.missing: list[str] = []
        self.job: int | None = None
        self.deadline = time.monotonic() + READY_TIMEOUT_S

    def fileno(self) -> int:
        return self.fd

    def read_line(self, max_bytes: int) -> bytes | None:
        """The next complete line (without its newline), b"" when none has arrived yet, None at end of file.

        Raises:
            ValueError: a line longer than `max_bytes`.
        """
        while b"\n" not in self.buf:
            if len(self.buf) > max_bytes:
                raise ValueError(f"a line longer than {max_bytes} bytes")
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:  # nothing more now
                return b""
            if not chunk:
                return None
            self.buf += chunk
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        if len(line) > max_bytes:
            raise ValueError(f"a line longer than {max_bytes} bytes")
        return line

    def send(self, obj: dict) -> None:
        """One request line (OSError or TimeoutError when the template does not take it)."""
        _write_all(self.stdin_fd, (json.dumps(obj) + "\n").encode(), GRACE_S)

    # what `dapo_rl.children` calls at interpreter exit
    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        # not reaped: its pid, the id of its session's group, is still its own (a reaped one may be another's)
        if self.proc.returncode is None:
            try:  # the launcher and the template (everything below the template dies with it)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.kill()  # no signal once reaped
        except OSError:
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, timeout_s: float = 1.0) -> None:
        """Close its stdin (it ends after its current call), wait `timeout_s` seconds, then kill it; idempotent."""
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.join(timeout_s)
        self.kill()
        self.join(children.KILL_JOIN_S)
        children.unregister(self)
        try:  # empty on the host's side where the tmpfs was mounted; whatever is there, never an error here
            shutil.rmtree(self.workroot, ignore_errors=True)
        except Exception:
            pass


class ProgramRunner:
    """Runs Python programs in `num_workers` sandbox templates, concurrently, each program confined (see the module
    docstring).

    Args:
        num_workers: template processes, >= 1 (programs run side by side, one per template).
        limits: what each program may use (`ProgramLimits`).

    Use as a context manager or call `close()`.

    Raises:
        ValueError: `num_workers` < 1.
        RuntimeError: a template did not start within `READY_TIMEOUT_S` (all are stopped).
    """

    def __init__(self, num_workers: int = 1, limits: ProgramLimits = ProgramLimits()):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        self.limits = limits
        self.layers: dict[str, bool] = {}
        """The confinement layers in place (``rlimits``, ``files``, ``reads``, ``network``, ``processes``,
        ``isolation``, ``disk``: docs/sandbox.md says what each covers)."""
        self.missing: list[str] = []
        """The layers the OS did not give, one line each with the reason (empty when all are in place)."""
        self._call_limits: list[ProgramLimits] = []
        """The limits of each program of the call in progress (`run`'s, else the runner's)."""
        self._slots: list[_Template | None] = []
        self._failures: list[int] = []
        self._why = ""
        """Why the last template was replaced."""
        try:
            for _ in range(num_workers):
                self._slots.append(_Template())
                self._failures.append(0)
            while not all(t is not None and t.ready for t in self._slots):
                self._poll(deque(), [], [])
                if any(t is None for t in self._slots):
                    raise RuntimeError("the program sandbox could not start: " + self._why)
        except BaseException:
            self.close()
            raise
        first = self._slots[0]
        self.layers, self.missing = first.layers, first.missing
        if self.missing:
            only = "" if self.layers.get("files") or self.layers.get("processes") else "rlimits only; "
            warnings.warn(
                f"the program sandbox runs with fewer OS layers than it could: {only}"
                + "; ".join(self.missing),
                RuntimeWarning,
                stacklevel=2,
            )

    def __enter__(self) -> ProgramRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The templates' process ids (the programs' parents)."""
        return [t.proc.pid for t in self._slots if t is not None]

    def close(self) -> None:
        """Stop the templates; idempotent."""
        slots, self._slots = self._slots, []
        for t in slots:
            if t is not None:
                try:
                    t.proc.stdin.close()
                except OSError:
                    pass
        for t in slots:
            if t is not None:
                t.stop()

    def run(
        self,
        programs: Sequence[str],
        stdin: Sequence[str] | None = None,
        limits: ProgramLimits | Sequence[ProgramLimits] | None = None,
    ) -> list[ProgramResult]:
        """Run each program (Python source) with its stdin; results in the programs' order. Never raises on what a
        program does.

        Args:
            programs: Python source texts.
            stdin: one standard input per program (UTF-8 text); None: empty.
            limits: this call's limits instead of the runner's, one for all programs or one per program (a code
                reward's wall time grows with its tests); None: the runner's.

        Returns:
            One `ProgramResult` per program.

        Raises:
            ValueError: `stdin` or `limits` is not as long as `programs`.
            RuntimeError: the runner is closed.
        """
        if stdin is not None and len(stdin) != len(programs):
            raise ValueError(f"{len(stdin)} stdin texts for {len(programs)} programs")
        if limits is None or isinstance(limits, ProgramLimits):
            per = [self.limits if limits is None else limits] * len(programs)
        else:
            per = list(limits)
            if len(per) != len(programs):
                raise ValueError(f"{len(per)} limits for {len(programs)} programs")
        if programs and not self._slots:
            raise RuntimeError("the program runner is closed")
        self._call_limits = per
        results: list[ProgramResult | None] = [None] * len(programs)
        pending = deque(range(len(programs)))
        requests = [
            {"code": str(p), "stdin": "" if stdin is None else str(stdin[i]), "limits": asdict(per[i])}
            for i, p in enumerate(programs)
        ]
        while pending or any(t is not None and t.job is not None for t in self._slots):
            if not self._poll(pending, results, requests):  # no template can start: the rest fail
                for i in pending:
                    results[i] = sandbox_error(f"no sandbox template could start: {self._why}")
                pending.clear()
        return results  # type: ignore[return-value]

    def _poll(self, pending: deque[int], results: list, requests: list) -> bool:
        """One round: hand pending programs to idle templates, wait for the next line or deadline, read it. False
        when no template is left (each failed `MAX_START_FAILURES` starts in a row; `_why` says why)."""
        for i, t in enumerate(self._slots):
            if t is not None and t.ready and t.job is None and pending:
                idx = pending.popleft()
                try:
                    t.send(requests[idx])
                except (OSError, TimeoutError) as e:  # it died while idle: the program never started
                    pending.appendleft(idx)
                    self._replace(i, f"the template took no request ({type(e).__name__})")
                    continue
                t.job = idx
                t.deadline = time.monotonic() + self._call_limits[idx].wall_s + GRACE_S
        waiting = [t for t in self._slots if t is not None and (t.job is not None or not t.ready)]
        if not waiting:
            return any(t is not None for t in self._slots)
        timeout = max(0.0, min(t.deadline for t in waiting) - time.monotonic())
        readable = wait(waiting, timeout)
        for t in waiting:
            i = self._slots.index(t)
            try:
                line = t.read_line(self._max_line()) if t in readable else b""
            except ValueError as e:
                self._fail(i, results, f"the sandbox template sent {e}")
                continue
            if line is None:
                t.join(GRACE_S)
                self._fail(i, results, f"the sandbox template died (exit code {t.proc.returncode})")
            elif line:
                self._answer(i, line, results)
            elif time.monotonic() >= t.deadline:
                what = "answer" if t.ready else "start"
                self._fail(i, results, f"the sandbox template did not {what} in time")
        return any(t is not None for t in self._slots)

    def _max_line(self) -> int:
        """The longest result line the current call's output cap allows (JSON escapes: at most 6 bytes per byte
        kept, of stdout and of stderr)."""
        return 12 * max((x.output_bytes for x in self._call_limits), default=self.limits.output_bytes) + (
            1 << 16
        )

    def _answer(self, i: int, line: bytes, results: list) -> None:
        t = self._slots[i]
        try:
            obj = json.loads(line)
            if not t.ready:
                if not (isinstance(obj, dict) and obj.get("ready") is True):
                    why = obj.get("why") if isinstance(obj, dict) else None
                    raise ValueError(f"no ready line ({why or line[:200]!r})")
                t.layers = {str(k): bool(v) for k, v in dict(obj["layers"]).items()}
                t.missing = [str(x) for x in obj["missing"]]
                t.ready = True
                self._failures[i] = 0
                return
            if t.job is None:
                raise ValueError("an answer to no request")
            results[t.job] = _result(obj, self._call_limits[t.job])
            t.job = None
        except (ValueError, KeyError, TypeError) as e:
            self._fail(i, results, f"the sandbox template sent something malformed ({e})")
            return
        if isinstance(obj, dict) and obj.get("retire"):  # it answered, and can take no more
            self._replace(i, f"the sandbox template retired ({str(obj['retire'])[:200]})")

    def _fail(self, i: int, results: list, why: str) -> None:
        """Template `i` died or misbehaved: its program (if any) gets a sandbox_error; a fresh template takes its
        place (unless `MAX_START_FAILURES` starts in a row failed there)."""
        t = self._slots[i]
        if t.job is not None:
            results[t.job] = sandbox_error(why)
            t.job = None
        elif not t.ready:
            self._failures[i] += 1
        self._replace(i, why)

    def _replace(self, i: int, why: str) -> None:
        self._why = why
        self._slots[i].stop(0)
        self._slots[i] = _Template() if self._failures[i] < MAX_START_FAILURES else None


def run_cli(
    code: str | None,
    file: str | None,
    stdin: str | None = None,
    timeout_s: float = 10.0,
    memory_mib: int = 1024,
) -> int:
    """`dapo sandbox -c CODE` / `--file F`: run one program exactly as the tool does and print one JSON object: the
    `ProgramResult`'s fields, ``layers`` (the layers in place) and ``missing``.

    Args:
        code: the program's source, or None to read `file`.
        file: a file holding the program.
        stdin: its standard input.
        timeout_s: its wall and CPU seconds.
        memory_mib: its address space, MiB.

    Returns:
        The exit code: 0 when the sandbox worked (whatever the program's status), 1 on ``sandbox_error``, 2 when
        `file` cannot be read or a limit is not > 0.
    """
    if code is None:
        try:
            code = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, TypeError) as e:
            print(f"dapo sandbox: error: cannot read the program: {e}", file=sys.stderr)
            return 2
    try:
        limits = ProgramLimits(wall_s=timeout_s, cpu_s=timeout_s, memory_bytes=int(memory_mib) << 20)
    except ValueError as e:
        print(f"dapo sandbox: error: {e}", file=sys.stderr)
        return 2
    try:
        with ProgramRunner(1, limits) as runner:
            (result,) = runner.run([code], None if stdin is None else [stdin])
            layers, missing = runner.layers, runner.missing
    except RuntimeError as e:
        result, layers, missing = sandbox_error(str(e)), {}, []
    print(json.dumps({**result.to_json(), "layers": layers, "missing": missing}, ensure_ascii=False))
    return 1 if result.status == "sandbox_error" else 0
