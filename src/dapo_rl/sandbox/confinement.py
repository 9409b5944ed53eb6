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

Two options for callers that run whole programs (the program sandbox, `dapo_rl.sandbox.program`); the reward
pool's workers use neither:

- **no reads outside an allow-list** (`read_paths`): Landlock also handles reading files and listing directories,
  allowed only under the given paths (the Python installation, `python_install_paths`) and the working directory;
  ``/proc`` (another process's environment or memory), ``/etc`` and the caller's files are then unreadable.
- **signals only to itself** (`self_signals_only`): the seccomp filter also fails ``kill``, ``tgkill`` and
  ``rt_(tg)sigqueueinfo`` aimed at any other process, ``tkill``, ``pidfd_open``, ``pidfd_send_signal``,
  ``ptrace`` and ``process_vm_readv``/``writev`` (Landlock's signal scoping, ABI >= 6, does the same where the kernel
  has it; this covers older kernels).

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
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field

CLONE_NEWNS = 0x00020000
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
    """No writes outside the working directory, no exec (Landlock)."""
    reads: bool = False
    """No reads outside `read_paths` and the working directory (Landlock; only when `confine` was given
    `read_paths`)."""
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


SHARED_LIBRARY_PATHS = (
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/etc/ld.so.cache",
    "/dev/null",
    "/dev/urandom",
)
"""What the interpreter reads besides its own installation: shared libraries (the C library, libffi, libssl, loaded
by extension modules on import), the dynamic linker's cache, ``/dev/null`` and ``/dev/urandom``."""


def python_install_paths() -> list[str]:
    """The read allow-list of a program sandbox: this interpreter's installation (``sys.prefix``,
    ``sys.base_prefix``, ``sys.exec_prefix``, ``sys.base_exec_prefix``, the standard library and site-packages
    directories) and `SHARED_LIBRARY_PATHS`; only paths that exist, never ``/``, each once, in that order."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    sc = sysconfig.get_paths()
    paths += [sc[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in sc]
    paths += site.getsitepackages() + list(SHARED_LIBRARY_PATHS)
    out: list[str] = []
    for p in paths:
        p = os.path.realpath(p)
        if p != "/" and os.path.exists(p) and p not in out:
            out.append(p)
    return out


def _landlock(workdir: str, read_paths: Sequence[str] | None) -> tuple[bool, bool, str | None]:
    """Landlock: writes and execution (and, with `read_paths`, reads) only as allowed, TCP denied, signals scoped.
    Returns (files, tcp, why not)."""
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
    reads = fs.NONE if read_paths is None else fs.READ_FILE | fs.READ_DIR
    with ll.Ruleset(
        handled_fs=writes | reads | fs.EXECUTE,
        handled_net=net,
        scoped=ll.Scope.ABSTRACT_UNIX_SOCKET | ll.Scope.SIGNAL,
    ) as rules:
        rules.allow_path(workdir, writes | reads)
        for path in read_paths or ():
            if os.path.exists(path):  # a rule on a file may hold only file rights (EINVAL otherwise)
                rules.allow_path(path, reads if os.path.isdir(path) else reads & fs.READ_FILE)
        if os.path.exists("/dev/null"):
            rules.allow_path("/dev/null", fs.WRITE_FILE | (reads & fs.READ_FILE))
        rules.restrict()
        return True, bool(rules.handled_net), None


def _seccomp(self_signals_only: bool = False) -> str | None:
    """Fail process creation and exec (and, with `self_signals_only`, signals to and tracing of other processes);
    None when done, else why not."""
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
    if self_signals_only:
        pid = os.getpid()
        for name in (
            "kill",
            "tgkill",
            "rt_sigqueueinfo",
            "rt_tgsigqueueinfo",
        ):  # argument 0: the target (group)
            f.add_rule(eperm, name, sc.Arg(0, sc.NE, pid))
        for name in (
            "tkill",
            "pidfd_open",
            "pidfd_send_signal",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
        ):
            f.add_rule(eperm, name)
    f.load()
    return None


def confine(
    workdir: str,
    limits: Limits = Limits(),
    *,
    read_paths: Sequence[str] | None = None,
    unshare_network: bool = True,
    self_signals_only: bool = False,
) -> Confinement:
    """Confine this process (and its future threads) for handling model output; irreversible.

    Call it from a fresh, single-threaded child process before it reads any model output (a user namespace needs a
    single thread). The working directory becomes `workdir`, the only place it may write.

    Args:
        workdir: an existing directory of this process's own (the caller creates and later removes it).
        limits: resource limits.
        read_paths: when given, no reads outside these paths and `workdir` (Landlock); None (the default): reads
            are not restricted.
        unshare_network: make a network namespace of its own; False when the caller already runs in one (the
            program sandbox's template enters one once for all its children).
        self_signals_only: also fail signals to other processes, ``ptrace`` and cross-process memory access
            (seccomp).

    Returns:
        What is in place (`Confinement`); layers the OS does not offer are listed in `Confinement.missing`.
    """
    out = Confinement()
    os.chdir(workdir)
    if unshare_network:
        why = (
            _unshare_network()
        )  # before the seccomp filter and no_new_privs: needs the capabilities it has now
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
    why = _seccomp(
        self_signals_only
    )  # before Landlock: finding libseccomp may run ldconfig and write a temporary file
    out.processes = why is None or os.getuid() != 0  # RLIMIT_NPROC holds for any other user
    if why and not out.processes:
        out.notes.append(why)
    try:
        files, tcp, why = _landlock(workdir, read_paths)
    except OSError as e:
        files, tcp, why = False, False, f"Landlock failed ({e})"
    out.files = files
    out.reads = files and read_paths is not None
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
