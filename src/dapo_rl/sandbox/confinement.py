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
  ``EPERM`` (a pathname UNIX socket, such as multiprocessing's fork server's, is otherwise reachable), and
  ``io_uring_setup``/``io_uring_enter``/``io_uring_register`` with ``ENOSYS`` (as Docker's default profile: io_uring
  has socket and connect operations of its own that no system-call filter sees).
- **no escape hatches** (the same filter, `ESCAPE_SYSCALLS`, ``EPERM``): ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd``, ``kcmp``, ``userfaultfd``, ``bpf``, ``perf_event_open``, the key-ring calls, ``unshare``,
  ``setns``, every mount call, ``name_to_handle_at``/``open_by_handle_at``, ``syslog``, ``truncate`` by path
  (Landlock handles truncation only from ABI 3), SysV IPC and POSIX message queues (objects that outlive the process,
  or belong to others). No confined process needs any of them.

Three options for callers that run whole programs (the program sandbox, `dapo_rl.sandbox.program`); the reward
pool's workers use none:

- **no reads outside an allow-list** (`read_paths`): Landlock also handles reading files and listing directories,
  allowed only under the given paths (the Python installation, `python_install_paths`) and the working directory;
  ``/proc`` (another process's environment or memory), ``/etc`` and the caller's files are then unreadable.
- **signals only to itself** (`self_signals_only`): the seccomp filter also fails ``kill``, ``tgkill`` and
  ``rt_(tg)sigqueueinfo`` aimed at any other process, ``tkill``, ``pidfd_open``, ``pidfd_send_signal``,
  ``prlimit64`` on any process but itself (pid 0), and the requests that make the kernel signal a process later:
  ``fcntl`` ``F_SETOWN``/``F_SETOWN_EX``/``F_SETSIG`` and ``ioctl`` ``FIOSETOWN``/``SIOCSPGRP`` (the command compared
  on its low 32 bits, as the kernel reads it). Landlock's signal scope (ABI >= 6) denies signals to processes
  outside the sandbox as well; on older kernels this filter is the only guard.
- **no metadata changes** (`deny_metadata`): the filter also fails ``chmod``/``fchmod``/``fchmodat``/``fchmodat2``,
  the ``chown`` family, ``utime``/``utimes``/``utimensat``/``futimesat``, every call that sets or removes an
  extended attribute, ``file_setattr``, and ``ioctl`` ``FS_IOC_SETFLAGS``/``FS_IOC_FSSETXATTR``. Landlock does not
  control any of these: a process that owns host files by uid (root's files, for a process running as root) could
  otherwise set their set-user-ID bit.

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
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

ESCAPE_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "userfaultfd",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "mount_setattr",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "name_to_handle_at",
    "open_by_handle_at",
    "syslog",
    "truncate",
    "shmget",
    "shmat",
    "shmctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
)
"""System calls every confined process fails with ``EPERM`` (the module docstring)."""

METADATA_SYSCALLS = (
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
    "file_setattr",
)
"""System calls that change a file's mode, owner, times or extended attributes (`deny_metadata`)."""

_NEW_SYSCALLS = {
    "fchmodat2": 452,
    "setxattrat": 463,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_setattr": 469,
}
"""Numbers of recent system calls an older libseccomp cannot name: the same on x86-64 and arm64, as every system call
numbered from 424 on (``arch/x86/entry/syscalls/syscall_64.tbl``, ``include/uapi/asm-generic/unistd.h``)."""

F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR = 0x40086602, 0x40046602, 0x401C5820


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
    """No writes outside the working directory, no exec (Landlock); complete only where truncation by path is denied
    too (Landlock ABI >= 3, or the seccomp filter)."""
    reads: bool = False
    """No reads outside `read_paths` and the working directory (Landlock; only when `confine` was given
    `read_paths`)."""
    network: bool = False
    processes: bool = False
    metadata: bool = False
    """No changes to files' mode, owner, times or extended attributes (seccomp; only when `confine` was given
    `deny_metadata`)."""
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


def _landlock(workdir: str, read_paths: Sequence[str] | None) -> tuple[bool, bool, bool, str | None]:
    """Landlock: writes and execution (and, with `read_paths`, reads) only as allowed, TCP denied, signals scoped.
    Returns (files, truncation handled, tcp, why not)."""
    try:
        import landlockpy as ll
    except ImportError:
        return False, False, False, "landlockpy is not installed (pip install landlockpy)"
    if ll.abi_version() < 1:
        return False, False, False, "the kernel has no Landlock (Linux >= 5.13 with landlock in its LSM list)"
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
        return True, bool(rules.handled_fs & fs.TRUNCATE), bool(rules.handled_net), None


def _syscall_number(sc, name: str) -> int | None:
    """The native number of system call `name`, or None where neither libseccomp nor `_NEW_SYSCALLS` knows it."""
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if nr >= 0:
        return nr
    if name in _NEW_SYSCALLS and os.uname().machine in ("x86_64", "aarch64"):
        return _NEW_SYSCALLS[name]
    return None


def _low32(arg: int, value: int):
    """A seccomp comparison of a 32-bit argument (an ``int`` command) with `value`: the kernel reads only its low
    half, so a plain 64-bit equality would miss ``value | 1 << 32``."""
    import pyseccomp as sc

    return sc.Arg(arg, sc.MASKED_EQ, 0xFFFFFFFF, value)


_PID_PLACEHOLDER = 0x7EADBEEF
"""The pid in a filter compiled ahead (`compile_seccomp`): larger than any pid (``pid_max`` is at most 2**22)."""

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def _seccomp(self_signals_only: bool = False, deny_metadata: bool = False) -> str | None:
    """Fail process creation, exec, sockets, io_uring and `ESCAPE_SYSCALLS` (and, with `self_signals_only`, signals
    to, limits of and tracing of other processes; with `deny_metadata`, `METADATA_SYSCALLS`); None when done, else
    why not."""
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError, RuntimeError) as e:  # libseccomp.so.2 missing: RuntimeError or OSError
        return f"no seccomp filter ({type(e).__name__}: {e})"
    _filter(self_signals_only, deny_metadata, os.getpid()).load()
    return None


def compile_seccomp(self_signals_only: bool = False, deny_metadata: bool = False) -> bytes:
    """The filter `confine` loads with these options, as a BPF program for `confine`'s `seccomp_program`, with a
    placeholder where the confined process's pid goes. Building a filter of this size takes libseccomp about a
    millisecond: a caller that confines a fresh child per task compiles it once.

    Raises:
        ImportError, OSError, RuntimeError: no libseccomp.
    """
    f = _filter(self_signals_only, deny_metadata, _PID_PLACEHOLDER)
    fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_program(program: bytes, self_signals_only: bool) -> str | None:
    """Load a filter from `compile_seccomp`, this process's pid in place of the placeholder; None when done."""
    code = bytearray(program)
    ks = memoryview(code).cast("I")[1::2]  # each instruction: code (16 bits), jt, jf (8 each), k (32)
    found = 0
    for i, k in enumerate(ks):
        if k == _PID_PLACEHOLDER:
            ks[i] = os.getpid()
            found += 1
    if self_signals_only and not found:  # (libseccomp compares once for kill, tgkill and rt_(tg)sigqueueinfo)
        return "no seccomp filter (the compiled one holds no pid to fill in)"
    buf = (ctypes.c_char * len(code)).from_buffer(code)
    prog = _SockFprog(len(code) // 8, ctypes.addressof(buf))
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0
    ):
        return f"no seccomp filter ({os.strerror(ctypes.get_errno())})"
    return None


def _filter(self_signals_only: bool, deny_metadata: bool, pid: int):
    """The seccomp filter (a ``pyseccomp.SyscallFilter``, not loaded) for a process of id `pid`."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm, enosys = sc.ERRNO(errno.EPERM), sc.ERRNO(errno.ENOSYS)

    def deny(action, name: str, *args) -> None:
        nr = _syscall_number(sc, name)
        if nr is not None:  # a system call this machine's libseccomp cannot name is one its kernel predates
            f.add_rule(action, nr, *args)

    # no new sockets either: a pathname UNIX socket (multiprocessing's fork server listens on one in /tmp) is not a
    # Landlock right before ABI 9, and the confined process needs none (its pipe to the parent already exists)
    for name in ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "connect", *ESCAPE_SYSCALLS):
        deny(eperm, name)
    deny(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    for name in ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"):
        deny(enosys, name)
    if self_signals_only:
        for name in (
            "kill",
            "tgkill",
            "rt_sigqueueinfo",
            "rt_tgsigqueueinfo",
        ):  # argument 0: the target (group)
            deny(eperm, name, sc.Arg(0, sc.NE, pid))
        for name in ("tkill", "pidfd_open", "pidfd_send_signal"):
            deny(eperm, name)
        deny(eperm, "prlimit64", sc.Arg(0, sc.NE, 0))  # 0: itself (setrlimit and getrlimit use it)
        for cmd in (F_SETOWN, F_SETOWN_EX, F_SETSIG):  # the kernel would signal the owner on I/O
            deny(eperm, "fcntl", _low32(1, cmd))
        for cmd in (FIOSETOWN, SIOCSPGRP):
            deny(eperm, "ioctl", _low32(1, cmd))
    if deny_metadata:
        for name in METADATA_SYSCALLS:
            deny(eperm, name)
        for cmd in (FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR):
            deny(eperm, "ioctl", _low32(1, cmd))
    return f


def files_complete(landlock: bool, truncation_handled: bool, seccomp: bool) -> bool:
    """Whether the ``files`` layer holds: Landlock in place, and truncation by path denied (by Landlock from ABI 3,
    else by the seccomp filter)."""
    return landlock and (truncation_handled or seccomp)


def confine(
    workdir: str,
    limits: Limits = Limits(),
    *,
    read_paths: Sequence[str] | None = None,
    unshare_network: bool = True,
    self_signals_only: bool = False,
    deny_metadata: bool = False,
    seccomp_program: bytes | None = None,
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
        self_signals_only: also fail signals to other processes, setting their resource limits, and the requests
            that make the kernel signal another process (seccomp).
        deny_metadata: also fail changing any file's mode, owner, times or extended attributes (seccomp).
        seccomp_program: the filter, compiled beforehand with the same options (`compile_seccomp`); None: built
            here.

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
    # before Landlock: finding libseccomp may run ldconfig and write a temporary file
    if seccomp_program is not None:
        seccomp_why = _load_program(seccomp_program, self_signals_only)
    else:
        seccomp_why = _seccomp(self_signals_only, deny_metadata)
    seccomp = seccomp_why is None
    out.processes = seccomp or os.getuid() != 0  # RLIMIT_NPROC holds for any other user
    out.metadata = seccomp and deny_metadata
    if seccomp_why and (not out.processes or deny_metadata):
        out.notes.append(seccomp_why)
    try:
        landlock, truncation, tcp, why = _landlock(workdir, read_paths)
    except OSError as e:
        landlock, truncation, tcp, why = False, False, False, f"Landlock failed ({e})"
    out.files = files_complete(landlock, truncation, seccomp)
    out.reads = landlock and read_paths is not None
    if why:
        out.notes.append(why)
    elif not out.files:
        out.notes.append(
            "files incomplete: Landlock below ABI 3 does not handle truncation, and no seccomp filter denies it"
        )
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
