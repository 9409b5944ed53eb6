"""The program sandbox's template process: trusted code that forks one confined child per program and reads it back.

`dapo_rl.sandbox.program.ProgramRunner` starts each template as a fresh interpreter (``python -I``, a scrubbed
environment, no inherited descriptors, a session of its own), so nothing a program can reach ever held the
trainer's environment or memory. The template then:

1. enters a user and network namespace of its own, once (`enter_namespaces`): no network for anything it forks
   (only a down loopback), and no capabilities outside the namespace; then drops the capabilities it holds inside
   it (`drop_capabilities`);
2. runs one empty program to learn which confinement layers the OS gives, and writes them as its first line,
   ``{"ready": true, "layers": {...}, "missing": [...]}``;
3. answers each request line on its stdin, ``{"code": str, "stdin": str, "limits": {...}}``
   (`dapo_rl.sandbox.program.ProgramLimits` as a dict), with one result line on its stdout (`run_program`), until
   its stdin closes.

Each program runs in a forked child (`_child`) that has its own temporary working directory (removed after the
call), its stdin, stdout and stderr on pipes, every other descriptor closed but its report pipe, and confines
itself before the program's first line (`dapo_rl.sandbox.confinement.confine`: rlimits, Landlock with reads limited
to the Python installation, seccomp without fork, exec, sockets or signals to others) and gets a CPU limit. The
template drains its output within the caps, kills it (and its process group) at the wall deadline, reaps it, and
classifies what happened from what it saw, never from the child's exit code alone (see `run_program`).
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import io
import json
import linecache
import math
import os
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from dataclasses import dataclass

import landlockpy  # noqa: F401 (imported here, before any fork: a child imports nothing once confined)
import pyseccomp  # noqa: F401 (finding libseccomp may run ldconfig: never in a child)

from dapo_rl.sandbox.confinement import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    Confinement,
    Limits,
    confine,
    python_install_paths,
)

REPORT_FD = 3
"""The child's report pipe: one line of layers (written before the program runs), then one line of outcome."""

REPORT_BYTES = 1 << 16
"""The most bytes of report the template reads."""

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces() -> str | None:
    """Enter a new user, network and mount namespace (this process and everything it forks later: no network, no
    capabilities in the host's namespaces, mounts of its own); network and mount namespaces alone where user
    namespaces are refused but this process may (root). Returns None when done, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS) == 0:
        try:  # the same ids inside as outside (files created in the working directory need a mapped owner)
            _write_file("/proc/self/setgroups", "deny")
            _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
            _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as e:
            return f"user namespace without an id map ({e})"
        return None
    first = os.strerror(ctypes.get_errno())
    if libc.unshare(CLONE_NEWNET | CLONE_NEWNS) == 0:
        return None
    return f"no network namespace (user namespace: {first}; network namespace: {os.strerror(ctypes.get_errno())})"


def mount_workroot(workroot: str, disk_bytes: int) -> str | None:
    """Mount a tmpfs of `disk_bytes` bytes on `workroot`, seen only in this process's mount namespace (the
    programs' working directories live in it: all they write together is bounded, and it vanishes with the
    template). Returns None when done, else why not (the directories then live on the host's disk, each file
    bounded by ``RLIMIT_FSIZE`` only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    # nothing mounted here propagates to the host's namespace (a root template's copy of it may be shared)
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"no private mount namespace ({os.strerror(ctypes.get_errno())}): no size-limited working directory"
    opts = f"size={max(disk_bytes, 1 << 16)},mode=0700".encode()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"tmpfs", workroot.encode(), b"tmpfs", flags, opts) != 0:
        return f"no tmpfs working directory ({os.strerror(ctypes.get_errno())}): written bytes bounded per file only"
    return None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> str | None:
    """Drop every capability this process holds (effective, permitted, inheritable, ambient); None when done."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"capabilities kept ({os.strerror(ctypes.get_errno())})"
    return None


def _layers(c: Confinement, place: Place) -> dict[str, bool]:
    return {
        "rlimits": c.rlimits,
        "files": c.files,
        "reads": c.reads,
        "network": c.network or place.netns,
        "processes": c.processes,
        "disk": place.disk,
    }


def _cpu_limit(seconds: float) -> None:
    """``RLIMIT_CPU`` of a fresh child: SIGXCPU after `seconds` (rounded up, at least 1) of CPU, SIGKILL a second
    later (a program that catches SIGXCPU). A forked child starts with no CPU time spent."""
    soft = max(1, math.ceil(seconds))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    new_hard = soft + 1 if hard == resource.RLIM_INFINITY else min(soft + 1, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(soft, new_hard), new_hard))


def _report(obj: dict) -> None:
    try:
        os.write(REPORT_FD, (json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def _child(
    code: str,
    fds: tuple[int, int, int, int],
    workdir: str,
    limits: dict,
    place: Place,
    template_pid: int,
) -> None:
    """A forked child's life (never returns): pipes in place, confined, the program run, the outcome reported."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the template dies: so does its child
    if os.getppid() != template_pid:
        os._exit(70)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    stdin_r, out_w, err_w, rep_w = fds
    os.dup2(stdin_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    if rep_w != REPORT_FD:
        os.dup2(rep_w, REPORT_FD)
    os.closerange(REPORT_FD + 1, os.sysconf("SC_OPEN_MAX"))
    # the template's own stdio objects stay referenced (collecting them would close descriptors 0-2)
    kept = (sys.stdin, sys.stdout, sys.stderr)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), "utf-8")
    # line-buffered (as on a terminal): what a program printed before its wall time reaches the template
    out = sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), "utf-8", line_buffering=True
    )
    err = sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        "utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    try:
        c = confine(
            workdir,
            Limits(
                memory_bytes=int(limits["memory_bytes"]),
                file_bytes=int(limits["file_bytes"]),
                open_files=int(limits["open_files"]),
            ),
            read_paths=place.read_paths,
            unshare_network=not place.netns,
            self_signals_only=True,
        )
        _cpu_limit(float(limits["cpu_s"]))
    except BaseException as e:  # the sandbox failed, not the program: it never ran
        _report({"sandbox_error": f"confinement failed: {type(e).__name__}: {e}"})
        os._exit(71)
    _report({"layers": _layers(c, place), "missing": c.missing()})
    os._exit(_run(code, out, err, kept))


def _run(code: str, out, err, kept) -> int:
    """Run the program as ``python -c`` would, in the confined child; report whether it raised; the exit status to
    use (not trusted by anyone)."""
    sys.argv = ["<program>"]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    atexit._clear()  # the template's exit hooks are not the program's
    # the program's lines quoted in its tracebacks, as Python does for a file
    linecache.cache["<program>"] = (len(code), None, code.splitlines(True), "<program>")
    outcome: dict = {"ok": True}
    try:
        # The one place model-written code is evaluated: in this child, already confined (namespaces, rlimits,
        # Landlock, seccomp), with the template reading back what it prints and deciding.
        exec(compile(code, "<program>", "exec"), main.__dict__)  # noqa: S102
    except SystemExit as e:
        if e.code is not None and e.code != 0:
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)  # as Python does: the message, exit status 1
            outcome = {"exit": e.code if isinstance(e.code, int) else 1}
    except BaseException as e:
        outcome = {"raised": type(e).__name__}
        try:  # as Python prints it, without this frame
            traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        except BaseException:
            try:
                err.write(f"{type(e).__name__}\n")
            except BaseException:
                pass
    try:
        threading._shutdown()  # type: ignore[attr-defined]  (non-daemon threads finish, as at interpreter exit)
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr, out, err):
        try:
            stream.flush()
        except BaseException:
            pass
    _report(outcome)
    del kept
    return 0 if "ok" in outcome else 1


@dataclass(frozen=True)
class Place:
    """Where a template's children run.

    Attributes:
        netns: the template runs in a network namespace of its own (its children need none).
        disk: `workroot` is the template's own size-limited tmpfs.
        read_paths: what a child may read besides its working directory (`python_install_paths`).
        workroot: where working directories are made; None: the temporary directory.
    """

    netns: bool
    disk: bool
    read_paths: list[str]
    workroot: str | None = None


def run_program(code: str, stdin: str, limits: dict, place: Place) -> tuple[dict, dict | None]:
    """Run one program in a fresh confined child; returns (result, layers line or None).

    Args:
        code: the program's source.
        stdin: its standard input (UTF-8).
        limits: `ProgramLimits` as a dict.
        place: where the child runs (`Place`).

    The result: ``{"status", "stdout", "stderr", "truncated", "wall_s", "detail"}``. Status, in this order of
    precedence: ``timeout`` (no exit within ``limits["wall_s"]``: killed), ``killed`` (ended by a signal: SIGXCPU at
    the CPU limit, SIGKILL; detail: the signal's name), ``sandbox_error`` (the child could not confine itself),
    ``error`` (no report of an outcome: "exited without a report"; or it raised, or exited with a non-zero
    ``SystemExit``), else ``ok``. The report is the child's own line about whether the program raised: it decides
    ``ok`` against ``error`` and nothing else (a program could forge it; it gains nothing a plain ``print`` would
    not).
    """
    wall_s, cap = float(limits["wall_s"]), int(limits["output_bytes"])
    workdir = tempfile.mkdtemp(prefix="dapo-program-", dir=place.workroot)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    template_pid = os.getpid()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            for fd in (in_w, out_r, err_r, rep_r):
                os.close(fd)
            _child(code, (in_r, out_w, err_w, rep_w), workdir, limits, place, template_pid)
        finally:
            os._exit(72)
    for fd in (in_r, out_w, err_w, rep_w):
        os.close(fd)
    try:
        os.setpgid(pid, pid)
    except OSError:  # it did so itself, or has exited
        pass
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    data, pos = stdin.encode("utf-8", "surrogateescape"), 0
    bufs = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray()}
    caps = {out_r: cap, err_r: cap, rep_r: REPORT_BYTES}
    truncated = timed_out = False
    status: int | None = None
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    os.set_blocking(in_w, False)
    if data:
        sel.register(in_w, selectors.EVENT_WRITE)
    else:
        os.close(in_w)
        in_w = -1
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    open_reads = set(bufs)
    deadline = t0 + wall_s
    try:
        while open_reads or status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = status is None
                break
            exited = False
            for key, _ in sel.select(remaining if pidfd is not None else min(remaining, 0.02)):
                fd = key.fd
                if fd == pidfd:
                    exited = True
                    sel.unregister(fd)
                elif fd == in_w:
                    try:
                        pos += os.write(in_w, data[pos : pos + 65536])
                    except BlockingIOError:
                        pass
                    except OSError:  # it closed its stdin
                        pos = len(data)
                    if pos >= len(data):
                        sel.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_reads.discard(fd)
                        continue
                    buf = bufs[fd]
                    room = caps[fd] - len(buf)
                    if len(chunk) > room:
                        truncated = truncated or fd != rep_r
                        chunk = chunk[: max(room, 0)]
                    buf += chunk
            if status is None and (exited or pidfd is None):
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
                    if in_w >= 0:  # it left without reading all its input
                        sel.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
    finally:
        try:  # anything left of its process group; then the child itself (a zombie keeps the group's id)
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if status is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
        wall = time.monotonic() - t0
        sel.close()
        for fd in [*bufs, in_w, pidfd]:
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [_json_or_none(x) for x in bytes(bufs[rep_r]).split(b"\n")[:2]]
    layers = lines[0] if lines and isinstance(lines[0], dict) and "layers" in lines[0] else None
    first = lines[0] if lines else None
    outcome = lines[1] if len(lines) > 1 and isinstance(lines[1], dict) else None
    if timed_out:
        st, detail = "timeout", f"no exit within the wall time of {wall_s:g} s: killed"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        st, detail = (
            "killed",
            signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig),
        )
    elif isinstance(first, dict) and "sandbox_error" in first:
        st, detail = "sandbox_error", str(first["sandbox_error"])
    elif outcome is None:
        st, detail = "error", f"exited without a report (exit status {os.waitstatus_to_exitcode(status)})"
    elif "raised" in outcome:
        st, detail = "error", f"raised {outcome['raised']}"
    elif "exit" in outcome:
        st, detail = "error", f"exit status {outcome['exit']}"
    else:
        st, detail = "ok", ""
    result = {
        "status": st,
        "stdout": bytes(bufs[out_r]).decode("utf-8", "replace"),
        "stderr": bytes(bufs[err_r]).decode("utf-8", "replace"),
        "truncated": truncated,
        "wall_s": round(wall, 4),
        "detail": detail,
    }
    return result, layers


def _json_or_none(b: bytes):
    try:
        return json.loads(b)
    except ValueError:
        return None


def _send(obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main() -> None:
    """The template's loop (see the module docstring). Arguments: ``sys.argv[2]``, the runner's pid (the template
    dies with it); ``sys.argv[3]``, an empty directory for the working directories (a tmpfs is mounted on it);
    ``sys.argv[4]``, that tmpfs's size in bytes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if len(sys.argv) > 2 and os.getppid() != int(sys.argv[2]):
        sys.exit(1)  # the runner died before this line
    workroot = sys.argv[3] if len(sys.argv) > 3 else None
    why = enter_namespaces()
    missing = [why] if why else []
    disk_why = mount_workroot(workroot, int(sys.argv[4])) if workroot else "no working root given"
    if disk_why:
        missing.append(disk_why)
    caps = drop_capabilities()  # after the mount: it needs them
    if caps:
        missing.append(caps)
    place = Place(
        netns=why is None, disk=disk_why is None, read_paths=python_install_paths(), workroot=workroot
    )
    probe_limits = {
        "wall_s": 30.0,
        "cpu_s": 10.0,
        "memory_bytes": Limits().memory_bytes,
        "output_bytes": 1024,
        "file_bytes": Limits().file_bytes,
        "open_files": Limits().open_files,
    }
    probe, layers = run_program("", "", probe_limits, place)
    if probe["status"] != "ok" or layers is None:
        _send(
            {
                "ready": False,
                "why": f"the empty program gave {probe['status']}: {probe['detail']} {probe['stderr']}",
            }
        )
        return
    _send({"ready": True, "layers": layers["layers"], "missing": missing + list(layers["missing"])})
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return
        req = json.loads(line)
        try:
            result, _ = run_program(req["code"], req.get("stdin") or "", req["limits"], place)
        except (
            OSError
        ) as e:  # no pipe, no fork, no temporary directory: the sandbox failed, the template goes on
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOSPC):
                result = {
                    "status": "sandbox_error",
                    "stdout": "",
                    "stderr": "",
                    "truncated": False,
                    "wall_s": 0.0,
                    "detail": f"{type(e).__name__}: {e}",
                }
            else:
                raise
        _send(result)


if __name__ == "__main__":
    main()
