"""Operating-system confinement for the processes that handle model output.

A process that scores, parses or (later) runs what a model wrote calls `confine` once, first thing, in a fresh child
(the sandbox's workers do, `dapo_rl.sandbox.workers`). From then on, for it and anything it starts:

- **limits** (``setrlimit``): address space (`Limits.memory_bytes`), size of any file written
  (`Limits.file_bytes`), open files (`Limits.open_files`), no core dumps, no child processes (``RLIMIT_NPROC`` 0:
  the kernel does not apply it to uid 0, hence the system-call filter below); CPU seconds per task through
  `cpu_budget`.
- **no writes outside its working directory** (a fresh temporary directory): Landlock (Linux >= 5.13, ``landlockpy``)
  denies creating, writing, truncating, renaming and removing files everywhere else, and executing any file; reads
  stay allowed (the Python installation and its lazily imported modules).
- **no network**: a network namespace of its own with no interface but a down loopback (``unshare(CLONE_NEWNET)``,
  as root or inside a new user namespace where unprivileged ones are allowed); Landlock also denies TCP connect and
  bind where the kernel supports it (ABI >= 4), and sending signals or connecting to abstract UNIX sockets outside
  the sandbox (ABI >= 6).
- **no new processes, no exec, no new sockets**: a seccomp filter (``pyseccomp`` over the system's libseccomp) fails
  ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads stay allowed), ``clone3`` (``ENOSYS``, so the C
  library falls back to ``clone``), ``execve``, ``execveat``, ``socket``, ``socketpair`` and ``connect`` with
  ``EPERM`` (a pathname UNIX socket, such as multiprocessing's fork server's, is otherwise reachable).

The caller also closes the descriptors it inherited and does not need before it confines itself (the sandbox's
workers keep only their pipe: `dapo_rl.sandbox.workers`), and reads what the process sends back as data, never
unpickled.

Each layer is applied where the OS offers it; what is not available is reported in the returned `Confinement`, and
the caller logs it once (`Confinement.missing`). Nothing here decides whether an answer is right: the parent reads
results back and decides.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
from dataclasses import dataclass, field

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000


@dataclass(frozen=True)
class Limits:
    """Resource limits of a confined process.

    Attributes:
        memory_bytes: address space (``RLIMIT_AS``), bytes. A scoring worker forked from the pool's fork server maps
            ~1 GiB (sympy, math-verify and reasoning-gym imported).
        file_bytes: largest file it may write (``RLIMIT_FSIZE``), bytes.
        open_files: open file descriptors (``RLIMIT_NOFILE``).
    """

    memory_bytes: int = 4 << 30
    file_bytes: int = 16 << 20
    open_files: int = 256


@dataclass
class Confinement:
    """What `confine` put in place (True) or could not (False), per layer."""

    rlimits: bool = False
    files: bool = False
    network: bool = False
    processes: bool = False
    notes: list[str] = field(default_factory=list)
    """Why a layer is missing, one line each."""

    def missing(self) -> list[str]:
        """The layers that are not in place, with the reason (empty when all are)."""
        return self.notes


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _unshare_network() -> str | None:
    """A network namespace of this process's own; None when done, else why not."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return None
    first = ctypes.get_errno()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:  # unprivileged: inside a user namespace of its own
        return None
    return f"no network namespace ({os.strerror(first)}; user namespace: {os.strerror(ctypes.get_errno())})"


def _landlock(workdir: str) -> tuple[bool, bool, str | None]:
    """Landlock: writes and execution only as allowed, TCP denied, signals scoped. Returns (files, tcp, why not)."""
    try:
        import landlockpy as ll
    except ImportError:
        return False, False, "landlockpy is not installed (pip install landlockpy)"
    if ll.abi_version() < 1:
        return False, False, "the kernel has no Landlock (Linux >= 5.13 with landlock in its LSM list)"
    fs = ll.AccessFS
    writes = (
        fs.WRITE_FILE
        | fs.REMOVE_DIR
        | fs.REMOVE_FILE
        | fs.MAKE_CHAR
        | fs.MAKE_DIR
        | fs.MAKE_REG
        | fs.MAKE_SOCK
        | fs.MAKE_FIFO
        | fs.MAKE_BLOCK
        | fs.MAKE_SYM
        | fs.REFER
        | fs.TRUNCATE
    )
    net = ll.AccessNet.BIND_TCP | ll.AccessNet.CONNECT_TCP
    with ll.Ruleset(
        handled_fs=writes | fs.EXECUTE,
        handled_net=net,
        scoped=ll.Scope.ABSTRACT_UNIX_SOCKET | ll.Scope.SIGNAL,
    ) as rules:
        rules.allow_path(workdir, writes)
        if os.path.exists("/dev/null"):
            rules.allow_path("/dev/null", fs.WRITE_FILE)
        rules.restrict()
        return True, bool(rules.handled_net), None


def _seccomp() -> str | None:
    """Fail process creation and exec; None when done, else why not."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as e:  # libseccomp.so.2 missing: RuntimeError or OSError
        return f"no seccomp filter ({type(e).__name__}: {e})"
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    # no new sockets either: a pathname UNIX socket (multiprocessing's fork server listens on one in /tmp) is not a
    # Landlock right before ABI 9, and the confined process needs none (its pipe to the parent already exists)
    for name in ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "connect"):
        f.add_rule(eperm, name)
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.load()
    return None


def confine(workdir: str, limits: Limits = Limits()) -> Confinement:
    """Confine this process (and its future threads) for handling model output; irreversible.

    Call it from a fresh, single-threaded child process before it reads any model output (a user namespace needs a
    single thread). The working directory becomes `workdir`, the only place it may write.

    Args:
        workdir: an existing directory of this process's own (the caller creates and later removes it).
        limits: resource limits.

    Returns:
        What is in place (`Confinement`); layers the OS does not offer are listed in `Confinement.missing`.
    """
    out = Confinement()
    os.chdir(workdir)
    why = _unshare_network()  # before the seccomp filter and no_new_privs: needs the capabilities it has now
    out.network = why is None
    if why:
        out.notes.append(why)
    signal.signal(
        signal.SIGXFSZ, signal.SIG_IGN
    )  # a write past the file limit fails (EFBIG) instead of killing
    for res, value in (
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, 0),
    ):
        _, hard = resource.getrlimit(res)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (value, value))
    out.rlimits = True
    why = _seccomp()  # before Landlock: finding libseccomp may run ldconfig and write a temporary file
    out.processes = why is None or os.getuid() != 0  # RLIMIT_NPROC holds for any other user
    if why and not out.processes:
        out.notes.append(why)
    try:
        files, tcp, why = _landlock(workdir)
    except OSError as e:
        files, tcp, why = False, False, f"Landlock failed ({e})"
    out.files = files
    if why:
        out.notes.append(why)
    out.network = out.network or tcp
    return out


def cpu_budget(seconds: float) -> None:
    """Allow this process `seconds` more CPU time from now (``RLIMIT_CPU`` soft limit; past it the kernel sends
    SIGXCPU, which kills the process). Call it before each task in a confined process.

    Args:
        seconds: CPU seconds, > 0 (rounded up to whole seconds, plus one).
    """
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(spent + seconds) + 2
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
