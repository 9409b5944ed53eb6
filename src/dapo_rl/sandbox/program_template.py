"""The program sandbox's template process: trusted code that forks one confined child per program and reads it back.

`dapo_rl.sandbox.program.ProgramRunner` starts each template as a fresh interpreter (``python -I``, a scrubbed
environment, no inherited descriptors, a session of its own), so nothing a program can reach ever held the
trainer's environment or memory. That interpreter, the *launcher* (`main`):

1. enters a user, network, mount, IPC and PID namespace of its own, once (`enter_namespaces`): no network for
   anything below it (only a down loopback), no capabilities in the host's namespaces, mounts and SysV IPC objects
   of its own;
2. forks the template proper, pid 1 of the new PID namespace: when the template dies, the kernel kills every
   process below it. The launcher only waits for it; the template dies with the launcher (``PR_SET_PDEATHSIG``, set
   by a child of the launcher's only thread, so it fires only when the launcher dies).

The template then makes its whole mount tree private, read-only and nosuid (`seal_mounts`: a program that owns host
files by uid can change none of them), keeps its capabilities inside its own user namespace (it mounts a tmpfs per
call; no program ever holds them), runs one empty program to learn which confinement layers the OS gives and writes
them as its first line, ``{"ready": true, "layers": {...}, "missing": [...]}``, and answers each request line on
its stdin, ``{"code": str, "stdin": str, "limits": {...}}`` (`dapo_rl.sandbox.program.ProgramLimits` as a dict),
with one result line on its stdout (`run_program`), until its stdin closes.

Each program runs in a forked child (`_child`) whose working directory is a fresh tmpfs of ``disk_bytes`` bytes and
``disk_files`` inodes. The child sees only its own PID namespace (the template is its pid 1: no process outside can
be named), drops every capability, takes its stdin, stdout and stderr on pipes, closes every other descriptor but
its report pipe, and confines itself before the program's first line (`dapo_rl.sandbox.confinement.confine`:
rlimits, Landlock with reads limited to the Python installation, seccomp without fork, exec, sockets, io_uring,
SysV IPC, signals to others or metadata changes) with a CPU limit. The template drains its output within the caps,
kills it at the wall deadline, kills whatever else is left in its PID namespace (``kill(-1, SIGKILL)`` from its
init: nothing of a call outlives it), reaps, unmounts the tmpfs (``MNT_DETACH``: nothing to walk, whatever the
program left there), and classifies what happened from what it saw, never from the exit code alone (see
`run_program`).
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
import select
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

import landlockpy  # imported here, before any fork: a child imports nothing once confined
import pyseccomp  # noqa: F401 (finding libseccomp may run ldconfig: never in a child)

from dapo_rl.sandbox.confinement import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    Confinement,
    Limits,
    compile_seccomp,
    confine,
    python_install_paths,
)

REPORT_FD = 3
"""The child's report pipe: one line of layers (written before the program runs), then one line of outcome."""

REPORT_BYTES = 8192
"""The most bytes of report the template keeps; a longer report is the program's doing (status ``error``)."""

DETAIL_CHARS = 200
"""The longest ``detail`` of a result."""

RAISED_CHARS = 100
"""The longest exception name a report may give."""

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
SYS_MOUNT_SETATTR = 442  # the same on every architecture (numbered after 424)
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_LIBC.syscall.restype = ctypes.c_long


def _errno_error(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces() -> tuple[int, str | None]:
    """Enter a new user, network, mount, IPC and PID namespace (network, mount, IPC and PID alone where user
    namespaces are refused but this process may: root). Returns the ``CLONE_NEW*`` flags entered (0: none) and why
    some are missing (None when all are there). The PID namespace holds this process's next child, not itself."""
    uid, gid = os.geteuid(), os.getegid()
    wanted = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID
    if _LIBC.unshare(CLONE_NEWUSER | wanted) == 0:
        try:  # the same ids inside as outside (files created in the working directory need a mapped owner)
            _write_file("/proc/self/setgroups", "deny")
            _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
            _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as e:
            return CLONE_NEWUSER | wanted, f"user namespace without an id map ({e})"
        return CLONE_NEWUSER | wanted, None
    first = os.strerror(ctypes.get_errno())
    if _LIBC.unshare(wanted) == 0:
        return wanted, None
    second = os.strerror(ctypes.get_errno())
    return 0, f"no namespaces (with a user namespace: {first}; without: {second})"


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def make_mounts_private() -> str | None:
    """Make every mount of this process's mount namespace private: nothing mounted here reaches the host's (a root
    template's copy of it may be shared). Returns None when done, else why not."""
    if _LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"no private mount namespace ({os.strerror(ctypes.get_errno())})"
    return None


def seal_mounts() -> str | None:
    """Make every mount of this process's (private) mount namespace read-only and nosuid, recursively
    (``mount_setattr(2)`` with ``AT_RECURSIVE``, Linux >= 5.12). A program that owns host files by uid can then
    change neither them nor their mode, times or attributes, and no set-user-ID bit counts. Returns None when done,
    else why not."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    rc = _LIBC.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(b"/"),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if rc != 0:
        return f"host files stay writable to their owner: no read-only remount ({os.strerror(ctypes.get_errno())})"
    return None


def mount_workdir(workroot: str, disk_bytes: int, disk_files: int) -> None:
    """Mount a fresh tmpfs of `disk_bytes` bytes and `disk_files` inodes on `workroot` (OSError when it fails)."""
    opts = f"size={max(int(disk_bytes), 1 << 16)},nr_inodes={max(int(disk_files), 16)},mode=0700".encode()
    if _LIBC.mount(b"tmpfs", workroot.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) != 0:
        raise _errno_error("mount tmpfs")


def unmount_workdir(workroot: str) -> None:
    """Detach the tmpfs on `workroot` (lazily: the kernel frees it when nothing holds it any more)."""
    if _LIBC.umount2(workroot.encode(), MNT_DETACH) != 0:
        raise _errno_error("umount2")


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
    _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _LIBC.capset(ctypes.byref(header), data) != 0:
        return f"capabilities kept ({os.strerror(ctypes.get_errno())})"
    return None


@dataclass
class Place:
    """Where a template's children run.

    Attributes:
        netns: the template runs in a network namespace of its own (its children need none).
        sealed: the template's mount tree is read-only and nosuid (`seal_mounts`).
        disk: each call gets a fresh tmpfs on `workroot` (`mount_workdir`).
        pidns: the template is pid 1 of a PID namespace of its own, and so its children's only view of processes.
        ipcns: the template has an IPC namespace of its own (SysV IPC objects end with it).
        read_paths: what a child may read besides its working directory (`python_install_paths`).
        seccomp: the children's seccomp filter, compiled once (`compile_seccomp`); None: each child builds its own.
        workroot: where working directories are (the tmpfs's mount point); None: the temporary directory.
        broken: why the template cannot go on (set when cleaning up after a call failed); it retires after its
            answer.
    """

    netns: bool
    sealed: bool
    disk: bool
    pidns: bool
    ipcns: bool
    read_paths: list[str]
    seccomp: bytes | None = None
    workroot: str | None = None
    broken: str | None = None


def _layers(c: Confinement, place: Place) -> dict[str, bool]:
    return {
        "rlimits": c.rlimits,
        "files": c.files and (c.metadata or place.sealed),
        "reads": c.reads,
        "network": c.network or place.netns,
        "processes": c.processes,
        "isolation": place.pidns and place.ipcns,
        "disk": place.disk,
    }


def _cpu_limit(seconds: float) -> None:
    """``RLIMIT_CPU`` of a fresh child: SIGXCPU after `seconds` (rounded up, at least 1) of CPU, SIGKILL a second
    later (a program that catches SIGXCPU). A forked child starts with no CPU time spent."""
    soft = max(1, math.ceil(seconds))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    new_hard = soft + 1 if hard == resource.RLIM_INFINITY else min(soft + 1, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(soft, new_hard), new_hard))


def _write_line(fd: int, obj: dict) -> None:
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def _report(obj: dict) -> None:
    _write_line(REPORT_FD, obj)


def _child(
    code: str,
    fds: tuple[int, int, int, int],
    workdir: str,
    limits: dict,
    place: Place,
    template_pid: int,
) -> None:
    """The program's process (never returns): no privileges, pipes in place, confined, the program run, the outcome
    reported."""
    # the template dies: so does it (its PID namespace, where there is one, does so anyway)
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != template_pid:
        os._exit(70)
    signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # as in any Python program (the template ignores it)
    _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no privileges from exec, whatever else fails
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
        why = drop_capabilities()  # the template's, in its user namespace: never the program's
        if why:
            raise PermissionError(why)
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
            deny_metadata=True,
            seccomp_program=place.seccomp,
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
            fits = isinstance(e.code, int) and -(1 << 31) <= e.code < 1 << 31
            outcome = {"exit": int(e.code) if fits else 1}
    except BaseException as e:
        outcome = {"raised": str(type(e).__name__)[:RAISED_CHARS]}
        try:  # as Python prints it, without this frame
            traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        except BaseException:
            try:
                err.write(f"{outcome['raised']}\n")
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


def _outcome(after_first: list[bytes], overflowed: bool) -> tuple[dict | None, str | None]:
    """The program's outcome from the report's lines after the first (the split's tail: the last item is what
    follows the last newline); (outcome, None), (None, None) when there is none, or (None, why it is malformed).
    Anything but exactly one well-formed line is the program's doing (it holds the report pipe)."""
    if overflowed:
        return None, f"a report longer than {REPORT_BYTES} bytes"
    if after_first in ([], [b""]):
        return None, None
    if len(after_first) != 2 or after_first[1] != b"":
        return None, "a malformed report"
    o = _json_or_none(after_first[0])
    if o == {"ok": True}:
        return o, None
    if isinstance(o, dict) and len(o) == 1:
        v = next(iter(o.values()))
        if "exit" in o and isinstance(v, int) and -(1 << 31) <= v < 1 << 31:
            return {"exit": int(v)}, None
        if "raised" in o and isinstance(v, str) and len(v) <= RAISED_CHARS:
            return o, None
    return None, "a malformed report"


def _reap(pid: int) -> int:
    """Kill what is left of the child's process group, then reap the child (dead or killed, not reaped before: the
    group's id is still its own) and return its wait status."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    return os.waitpid(pid, 0)[1]


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return _signal_name(os.WTERMSIG(status))
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _signal_name(sig: int) -> str:
    return signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)


def _make_workdir(place: Place, limits: dict) -> str:
    if place.disk:
        mount_workdir(place.workroot, limits["disk_bytes"], limits["disk_files"])
        return place.workroot
    return tempfile.mkdtemp(prefix="dapo-program-", dir=place.workroot)


def _remove_workdir(place: Place, workdir: str) -> None:
    """Never raises: a template that could not clean up retires after its answer (`Place.broken`)."""
    try:
        if place.disk:
            unmount_workdir(workdir)
        else:
            shutil.rmtree(workdir)
    except BaseException as e:
        place.broken = f"the working directory was not removed ({type(e).__name__}: {str(e)[:100]})"


def _sweep(place: Place) -> None:
    """Kill and reap whatever is left in the template's PID namespace but the template (its init): nothing of a call
    outlives it. Only a program without the seccomp filter could have left anything (a process it forked)."""
    if not place.pidns:
        return
    try:
        os.kill(-1, signal.SIGKILL)  # from pid 1: every other process of its namespace
    except OSError:  # none
        return
    while True:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_program(code: str, stdin: str, limits: dict, place: Place) -> tuple[dict, dict | None]:
    """Run one program in a fresh confined child; returns (result, layers line or None).

    Args:
        code: the program's source.
        stdin: its standard input (UTF-8).
        limits: `ProgramLimits` as a dict.
        place: where the child runs (`Place`).

    The result: ``{"status", "stdout", "stderr", "truncated", "wall_s", "detail"}`` (``detail`` at most
    `DETAIL_CHARS` characters). Status, in this order of precedence: ``timeout`` (no exit within
    ``limits["wall_s"]``: killed), ``killed`` (ended by a signal: SIGXCPU at the CPU limit, SIGKILL; detail: the
    signal's name), ``sandbox_error`` (the child could not confine itself: the sandbox failed, the program never
    ran), ``error`` (no report of an outcome: "exited without a report"; a report
    longer than `REPORT_BYTES` or malformed; or it raised, or exited with a non-zero ``SystemExit``), else ``ok``.
    The report is the child's own line about whether the program raised: it decides ``ok`` against ``error`` and
    nothing else (a program could forge it; it gains nothing a plain ``print`` would not).

    Raises:
        OSError: no pipe, no fork, no working directory (the sandbox failed; nothing ran).
    """
    wall_s, cap = float(limits["wall_s"]), int(limits["output_bytes"])
    t0 = time.monotonic()
    workdir = _make_workdir(place, limits)
    mine: list[int] = []  # the template's descriptors of this call
    theirs: list[int] = []  # the child's ends, closed here once it has them
    pid: int | None = None
    pidfd = None
    status: int | None = None
    timed_out = truncated = overflow = False
    bufs: dict[int, bytearray] = {}
    try:
        for i in range(4):  # stdin (the child reads), stdout, stderr, report (the template reads)
            r, w = os.pipe()
            (theirs if i == 0 else mine).append(r)
            (mine if i == 0 else theirs).append(w)
        in_w, out_r, err_r, rep_r = mine
        template_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                for fd in mine:
                    os.close(fd)
                _child(code, tuple(theirs), workdir, limits, place, template_pid)
            finally:
                os._exit(72)
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        try:
            os.setpgid(pid, pid)
        except OSError:  # it did so itself
            pass
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        data, pos = stdin.encode("utf-8", "surrogateescape"), 0
        bufs = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray()}
        caps = {out_r: cap, err_r: cap, rep_r: REPORT_BYTES}
        sel = selectors.DefaultSelector()
        try:
            for fd in bufs:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            os.set_blocking(in_w, False)
            if data:
                sel.register(in_w, selectors.EVENT_WRITE)
            else:
                os.close(in_w)
                mine.remove(in_w)
                in_w = -1
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ)
            open_reads = set(bufs)
            deadline = t0 + wall_s
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
                            mine.remove(in_w)
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
                            if fd == rep_r:
                                overflow = True
                            else:
                                truncated = True
                            chunk = chunk[: max(room, 0)]
                        buf += chunk
                if status is None and (exited or pidfd is None):
                    if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                        status = _reap(pid)
                        if in_w >= 0:  # it left without reading all its input
                            sel.unregister(in_w)
                            os.close(in_w)
                            mine.remove(in_w)
                            in_w = -1
        finally:
            sel.close()
    finally:
        if pid and status is None:  # still running (the wall deadline, or an error here)
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                else:  # not reaped yet: the pid is still its own
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            status = _reap(pid)
        wall = time.monotonic() - t0
        _sweep(place)
        for fd in [*mine, *theirs, *([pidfd] if pidfd is not None else [])]:
            try:
                os.close(fd)
            except OSError:
                pass
        _remove_workdir(place, workdir)
    lines = bytes(bufs.get(rep_r, b"")).split(b"\n")
    first = _json_or_none(lines[0]) if len(lines) > 1 else None  # written before the program ran
    layers = first if isinstance(first, dict) and "layers" in first else None
    failed = first.get("sandbox_error") if isinstance(first, dict) else None
    outcome, malformed = _outcome(lines[1:], overflow)
    if timed_out:
        st, detail = "timeout", f"no exit within the wall time of {wall_s:g} s: killed"
    elif os.WIFSIGNALED(status):
        st, detail = "killed", _signal_name(os.WTERMSIG(status))
    elif failed is not None:
        st, detail = "sandbox_error", str(failed)
    elif malformed:
        st, detail = "error", malformed
    elif outcome is None:
        st, detail = "error", f"exited without a report ({_describe(status)})"
    elif "raised" in outcome:
        st, detail = "error", f"raised {outcome['raised']}"
    elif "exit" in outcome:
        st, detail = "error", f"exit status {outcome['exit']}"
    else:
        st, detail = "ok", ""
    result = {
        "status": st,
        "stdout": bytes(bufs.get(out_r, b"")).decode("utf-8", "replace"),
        "stderr": bytes(bufs.get(err_r, b"")).decode("utf-8", "replace"),
        "truncated": truncated,
        "wall_s": round(wall, 4),
        "detail": detail[:DETAIL_CHARS],
    }
    return result, layers


def _json_or_none(b: bytes):
    try:
        return json.loads(b)
    except ValueError:
        return None


def _send(obj: dict) -> None:
    """One line to the runner; the runner gone (it closed its end while this template started or worked), this
    template ends quietly."""
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(1, view) :]
    except OSError:
        os._exit(0)


def _failure(detail: str) -> dict:
    return {
        "status": "sandbox_error",
        "stdout": "",
        "stderr": "",
        "truncated": False,
        "wall_s": 0.0,
        "detail": detail[:DETAIL_CHARS],
    }


_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOSPC)


def _serve_one(stdin, place: Place) -> bool:
    """Read one request, answer it; False at the end of the input or when this template must retire. Every
    request's data lives in this frame only (a child forked for the next call finds none of it up its stack)."""
    line = stdin.readline()
    if not line:
        return False
    req = json.loads(line)
    try:
        result, _ = run_program(req["code"], req.get("stdin") or "", req["limits"], place)
    except OSError as e:  # no pipe, no fork, no working directory: the sandbox failed, nothing ran
        result = _failure(f"{type(e).__name__}: {e}")
        if e.errno not in _RESOURCE_ERRNOS:  # not a passing shortage: this template is no use any more
            place.broken = place.broken or result["detail"]
    if place.broken:
        result["retire"] = place.broken[:DETAIL_CHARS]
    _send(result)
    return not place.broken


def _place(workroot: str | None, flags: int, missing: list[str]) -> Place:
    """Set up the template's side of the sandbox (its mounts, its PID namespace) and say what it gives."""
    disk = sealed = False
    private = make_mounts_private() if flags & CLONE_NEWNS else "no mount namespace"
    if workroot and not private:
        try:  # one tmpfs up and down: the per-call working directory works here
            mount_workdir(workroot, 1 << 16, 16)
            unmount_workdir(workroot)
            disk = True
        except OSError as e:
            missing.append(f"no tmpfs working directory ({e}): written bytes bounded per file only")
    else:
        why = private or "no working root given"
        missing.append(f"{why}: no tmpfs working directory, written bytes bounded per file only")
    if disk:  # sealed after the test mount (a read-only tree still takes mounts on it)
        why = seal_mounts()
        sealed = why is None
        if why:
            missing.append(why)
    pidns = bool(flags & CLONE_NEWPID) and os.getpid() == 1
    if not pidns:
        missing.append(
            "no PID namespace: a program's process can name others, and what it leaves is not swept"
        )
    if pidns:  # a program may name its template (pid 1): a signal it has a handler for would reach it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seccomp = compile_seccomp(self_signals_only=True, deny_metadata=True)
    except (ImportError, OSError, RuntimeError):  # each child finds out, and says so
        seccomp = None
    return Place(
        netns=bool(flags & CLONE_NEWNET),
        sealed=sealed,
        disk=disk,
        pidns=pidns,
        ipcns=bool(flags & CLONE_NEWIPC),
        read_paths=python_install_paths(),
        seccomp=seccomp,
        workroot=workroot,
    )


def _template(workroot: str | None, flags: int, missing: list[str]) -> None:
    """The template's life: its place, the empty program's probe, then one answer per request."""
    # landlockpy finds the C library on first use (ctypes.util.find_library: a subprocess): once here, not in
    # every child
    landlockpy.abi_version()
    place = _place(workroot, flags, missing)
    probe_limits = {
        "wall_s": 30.0,
        "cpu_s": 10.0,
        "memory_bytes": Limits().memory_bytes,
        "output_bytes": 1024,
        "file_bytes": Limits().file_bytes,
        "open_files": Limits().open_files,
        "disk_bytes": 1 << 20,
        "disk_files": 64,
    }
    try:
        probe, layers = run_program("", "", probe_limits, place)
    except OSError as e:
        probe, layers = _failure(f"{type(e).__name__}: {e}"), None
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
    while _serve_one(stdin, place):
        pass


def main() -> None:
    """The launcher (see the module docstring). Arguments: ``sys.argv[2]``, the runner's pid (unused);
    ``sys.argv[3]``, an empty directory, the mount point of each call's tmpfs."""
    workroot = sys.argv[3] if len(sys.argv) > 3 else None
    flags, why = enter_namespaces()
    missing = [why] if why else []
    if not flags & CLONE_NEWPID:
        _template(workroot, flags, missing)
        return
    alive_r, alive_w = os.pipe()  # the launcher's end stays open as long as it lives
    pid = os.fork()
    if pid == 0:  # the template: pid 1 of the new PID namespace
        code = 1
        try:
            os.close(alive_w)
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if select.select([alive_r], [], [], 0)[0]:  # end of file: the launcher died before the line above
                os._exit(1)
            os.close(alive_r)
            _template(workroot, flags, missing)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(alive_r)
    null = os.open(
        os.devnull, os.O_RDWR
    )  # the template alone holds the runner's pipes: its death is their end
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    main()
