"""The program sandbox (`dapo_rl.sandbox.program`) with real template processes and real programs, no mocks: what a
program prints and how it ended, a table of hostile programs each contained (the runner usable after each, nothing
of the program left running), a template killed from outside, the results' order, `dapo sandbox -c`."""

import ctypes
import json
import os
import signal
import socket
import stat
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sandbox_targets import threads_named

from dapo_rl.cli import main
from dapo_rl.sandbox import ProgramLimits, ProgramRunner, python_install_paths

SECRET_NAME, SECRET_VALUE = "DAPO_TEST_SANDBOX_SECRET", "hunter2-e8f1"
TABLE_LIMITS = ProgramLimits(wall_s=2.0, cpu_s=5.0, output_bytes=1000)


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (its children, theirs, ...)."""
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            found += kids
            stack += kids
    return found


def _stderr_last_line(r) -> str:
    return r.stderr.rstrip("\n").splitlines()[-1]


@pytest.fixture(scope="module")
def victim():
    """A process outside the sandbox, of the test's user (as the trainer is), that no program may touch."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def runner():
    """One template for the table, started after a secret was put in this process's environment."""
    os.environ[SECRET_NAME] = SECRET_VALUE
    try:
        with ProgramRunner(1, TABLE_LIMITS) as r:
            yield r
    finally:
        del os.environ[SECRET_NAME]


def test_print_stdin_and_how_a_program_ends(runner):
    prog = [
        "print(1+1)",
        "import sys\nprint(sys.stdin.read().upper(), end='')",
        "def f():\n    return 1 / 0\nf()",
        "import sys\nsys.exit(0)",
        "import sys\nsys.exit()",
        "import sys\nprint('before')\nsys.exit(3)",
        "raise SystemExit('bad input')",
        "print(",
        "import os\nos._exit(0)",
    ]
    stdin = ["", "abc\ndéf\n", "", "", "", "", "", "", ""]
    res = runner.run(prog, stdin)
    assert [(r.status, r.stdout, r.detail) for r in res] == [
        ("ok", "2\n", ""),
        ("ok", "ABC\nDÉF\n", ""),
        ("error", "", "raised ZeroDivisionError"),
        ("ok", "", ""),
        ("ok", "", ""),
        ("error", "before\n", "exit status 3"),
        ("error", "", "exit status 1"),
        ("error", "", "raised SyntaxError"),
        ("error", "", "exited without a report (exit status 0)"),
    ]
    assert res[0].stderr == "" and res[0].truncated is False and 0 < res[0].wall_s < 1.0
    # the traceback as Python prints it, the program's own lines quoted, none of the sandbox's frames
    tb = res[2].stderr
    assert tb.startswith("Traceback (most recent call last):\n")
    assert 'File "<program>", line 3, in <module>' in tb and 'File "<program>", line 2, in f' in tb
    assert "return 1 / 0" in tb and "program_template" not in tb
    assert _stderr_last_line(res[2]) == "ZeroDivisionError: division by zero"
    assert res[6].stderr == "bad input\n"
    assert _stderr_last_line(res[7]) == "SyntaxError: '(' was never closed"
    assert res[0].to_json() == {
        "status": "ok",
        "stdout": "2\n",
        "stderr": "",
        "truncated": False,
        "wall_s": res[0].wall_s,
        "detail": "",
    }


def _row_network(r, ctx) -> bool:
    return (
        r.status == "error" and _stderr_last_line(r) == "PermissionError: [Errno 1] Operation not permitted"
    )


def _row_reads(r, ctx) -> bool:
    denied = _stderr_last_line(r).startswith("PermissionError: [Errno 13] Permission denied")
    return r.status == "error" and denied and ctx["secret_text"] not in r.stdout + r.stderr


def _nofile(pid: int) -> str:
    """The "Max open files" line of /proc/<pid>/limits."""
    return next(
        x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files")
    )


def _row_metadata(r, ctx) -> bool:
    st = os.stat(ctx["victim_file"])
    return (
        r.status == "ok"
        and r.stdout == "1 1 1 1 1 1\n"  # EPERM each: the system-call filter
        and stat.S_IMODE(st.st_mode) == 0o644
        and st.st_mtime_ns == ctx["victim_mtime"]
        and st.st_size == 5
        and os.listxattr(ctx["victim_file"]) == ["user.keep"]
    )


def _row_io_uring(r, ctx) -> bool:
    try:
        conn, _ = ctx["listener"].accept()  # non-blocking: a connection that reached it would be waiting
    except BlockingIOError:
        conn = None
    if conn is not None:
        conn.close()
    return (
        r.status == "error"
        and _stderr_last_line(r) == "OSError: [Errno 38] Function not implemented"
        and conn is None
    )


IO_URING_CONNECT = """\
import ctypes, mmap, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, __import__('os').strerror(e))
    return rc
params = ctypes.create_string_buffer(120)
ring = check(libc.syscall(425, 4, params))  # io_uring_setup
sq_entries, cq_entries = struct.unpack_from('II', params.raw, 0)
_, sq_tail, sq_mask_at, _, _, _, sq_array = struct.unpack_from('7I', params.raw, 40)
cq_head, _, cq_mask_at, _, _, cqes = struct.unpack_from('6I', params.raw, 80)
sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=0)
cq = mmap.mmap(ring, cqes + 16 * cq_entries, offset=0x8000000)
sq_mask, cq_mask = struct.unpack_from('I', sq, sq_mask_at)[0], struct.unpack_from('I', cq, cq_mask_at)[0]
sqes = mmap.mmap(ring, 64 * sq_entries, offset=0x10000000)
addr = ctypes.create_string_buffer(struct.pack('H', 1) + {sock!r}.encode() + bytes(1))
def submit(opcode, fd, off, ptr, length):
    tail = struct.unpack_from('I', sq, sq_tail)[0]
    sqes[0:64] = struct.pack('BBHiQQII', opcode, 0, 0, fd, off, ptr, length, 0) + bytes(32)
    struct.pack_into('I', sq, sq_array + 4 * (tail & sq_mask), 0)
    struct.pack_into('I', sq, sq_tail, tail + 1)
    check(libc.syscall(426, ring, 1, 1, 1, None, 0))  # io_uring_enter, wait for one completion
    head = struct.unpack_from('I', cq, cq_head)[0]
    res = struct.unpack_from('i', cq, cqes + 16 * (head & cq_mask) + 8)[0]
    struct.pack_into('I', cq, cq_head, head + 1)
    return res
fd = submit(45, 1, 1, 0, 0)  # IORING_OP_SOCKET AF_UNIX SOCK_STREAM
print('socket', fd)
print('connect', submit(16, fd, len(addr.raw), ctypes.addressof(addr), 0))  # IORING_OP_CONNECT
"""


def _row_write(r, ctx) -> bool:
    last = _stderr_last_line(r)  # the read-only mount answers first where it is there, else Landlock
    denied = last.startswith(("PermissionError: [Errno 13]", "OSError: [Errno 30] Read-only file system"))
    return r.status == "error" and denied and not os.path.exists(ctx["outside"])


HOSTILE = [
    # name, program (formatted with ctx), layer it needs, check(result, ctx)
    (
        "infinite_loop",
        "while True:\n    pass",
        None,
        lambda r, ctx: (
            r.status == "timeout"
            and TABLE_LIMITS.wall_s <= r.wall_s < TABLE_LIMITS.wall_s + 1.0
            and r.stdout == ""
        ),
    ),
    (
        "fork_bomb",
        "import os\nwhile True:\n    os.fork()",
        "processes",
        lambda r, ctx: r.status == "error" and _stderr_last_line(r).startswith("PermissionError"),
    ),
    (
        "subprocess",
        "import subprocess\nsubprocess.run(['sleep', '100'])",
        "processes",
        lambda r, ctx: r.status == "error" and _stderr_last_line(r).startswith("PermissionError"),
    ),
    (
        "memory_bomb",
        # 100 MB blocks reach the 1 GiB address-space limit in ten steps without writing a page:
        # the zero-filled 10 MB bytearrays took 0.8 s alone and ran past the 2 s wall limit under
        # CI's load (2026-12-07), which tested the machine's speed, not the limit
        "a = []\nwhile True:\n    a.append(bytes(10**8))",
        None,
        lambda r, ctx: (
            (r.status == "error" and _stderr_last_line(r) == "MemoryError") or r.status == "killed"
        ),
    ),
    (
        "output_flood_forever",
        "while True:\n    print('x' * 1000)",
        None,
        lambda r, ctx: (
            r.status == "timeout" and r.truncated and len(r.stdout) == TABLE_LIMITS.output_bytes == 1000
        ),
    ),
    (
        "output_flood_once",
        "import sys\nprint('y' * 10**7)\nprint('e' * 10**6, file=sys.stderr)",
        None,
        lambda r, ctx: r.status == "ok" and r.truncated and r.stdout == "y" * 1000 and r.stderr == "e" * 1000,
    ),
    (
        "network_tcp",
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
        "network",
        _row_network,
    ),
    (
        "network_udp",
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('1.1.1.1', 53))",
        "network",
        _row_network,
    ),
    ("read_host_file", "print(open({secret!r}).read())", "reads", _row_reads),
    ("read_etc_hostname", "print(open('/etc/hostname').read())", "reads", _row_reads),
    ("list_host_dir", "import os\nprint(os.listdir({tmp!r}))", "reads", _row_reads),
    ("write_outside", "open({outside!r}, 'w').write('pwned')", "files", _row_write),
    (
        "disk_fill",  # 16 MiB files in the working directory until the template's 64 MiB tmpfs is full
        "i = 0\nwhile True:\n    open(f'f{{i}}', 'wb').write(b'x' * (16 << 20))\n    i += 1",
        "disk",
        lambda r, ctx: (
            r.status == "error" and _stderr_last_line(r) == "OSError: [Errno 28] No space left on device"
        ),
    ),
    (
        "file_too_large",  # RLIMIT_FSIZE: a write stops at file_bytes, the next one fails
        "import os\nfd = os.open('big', os.O_WRONLY | os.O_CREAT)\nprint(os.write(fd, b'x' * (17 << 20)))\nos.write(fd, b'x')",
        "rlimits",
        lambda r, ctx: (
            r.status == "error"
            and r.stdout == f"{16 << 20}\n"
            and _stderr_last_line(r) == "OSError: [Errno 27] File too large"
        ),
    ),
    (
        "environment",
        "import os\nprint(sorted(os.environ))",
        None,
        lambda r, ctx: r.status == "ok" and r.stdout == "['LANG', 'PATH', 'TMPDIR']\n",
    ),
    (
        "parent_environ",
        "import os\nprint(open(f'/proc/{{os.getppid()}}/environ').read())",
        "reads",
        lambda r, ctx: r.status == "error" and SECRET_VALUE not in r.stdout + r.stderr,
    ),
    (
        "caller_environ",
        "print(open('/proc/{test_pid}/environ').read())",
        "reads",
        lambda r, ctx: r.status == "error" and SECRET_VALUE not in r.stdout + r.stderr,
    ),
    (
        "kill_template",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "processes",
        lambda r, ctx: r.status == "error" and _stderr_last_line(r).startswith("PermissionError"),
    ),
    (
        "kill_caller",
        "import os, signal\nos.kill({test_pid}, signal.SIGKILL)",
        "processes",
        lambda r, ctx: r.status == "error" and _stderr_last_line(r).startswith("PermissionError"),
    ),
    (
        "host_file_metadata",  # the program runs as the owner of host files: the mount is read-only, seccomp denies
        "import os\n"
        "V = {victim_file!r}\n"
        "out = []\n"
        "for f in (lambda: os.chmod(V, 0o4755), lambda: os.utime(V, (0, 0)), lambda: os.setxattr(V, 'user.x', b'1'),\n"
        "          lambda: os.chown(V, 0, 0), lambda: os.truncate(V, 0), lambda: os.removexattr(V, 'user.keep')):\n"
        "    try:\n"
        "        f()\n"
        "        out.append('done')\n"
        "    except OSError as e:\n"
        "        out.append(str(e.errno))\n"
        "print(*out)",
        "files",
        _row_metadata,
    ),
    (
        "prlimit_other_process",  # would set another process's limits (the trainer's: crippled or killed)
        "import resource\nresource.prlimit({victim}, resource.RLIMIT_NOFILE, (3, 3))",
        "processes",
        lambda r, ctx: (
            r.status == "error"
            and _stderr_last_line(r).startswith("PermissionError")
            and _nofile(ctx["victim"]) == ctx["victim_nofile"]
        ),
    ),
    (
        "name_other_process",  # the template's PID namespace: its parent is pid 1, no process outside can be named
        "import os\nprint(os.getppid())\nos.sched_getparam({victim})",
        "isolation",
        lambda r, ctx: (
            r.status == "error"
            and r.stdout == "1\n"
            and _stderr_last_line(r).startswith("ProcessLookupError")
        ),
    ),
    (
        "io_uring_connect",  # io_uring's own socket and connect operations, past the socket/connect filter
        IO_URING_CONNECT,
        "network",
        _row_io_uring,
    ),
    (
        "signal_owner",  # F_SETOWN / FIOSETOWN would let the kernel signal another process (SIGIO, SIGURG)
        "import fcntl, os, struct\n"
        "r, w = os.pipe()\n"
        "out = []\n"
        "for f in (lambda: fcntl.fcntl(r, fcntl.F_SETOWN, {victim}), lambda: fcntl.fcntl(r, 10, 9),\n"
        "          lambda: fcntl.ioctl(r, 0x8901, struct.pack('i', {victim}))):\n"
        "    try:\n"
        "        f()\n"
        "        out.append('set')\n"
        "    except OSError as e:\n"
        "        out.append(str(e.errno))\n"
        "print(*out, fcntl.fcntl(r, fcntl.F_GETOWN))",
        "processes",
        lambda r, ctx: r.status == "ok" and r.stdout == "1 1 1 0\n",
    ),
    (
        "report_flood",  # a forged report too long for the template's answer, and a flood of output
        "import json, os\n"
        "os.write(3, (json.dumps({{'raised': chr(233) * 32000}}, ensure_ascii=False) + chr(10)).encode())\n"
        "print('z' * 10**6)",
        None,
        lambda r, ctx: (
            r.status == "error" and len(r.detail) <= 200 and r.truncated and r.stdout == "z" * 1000
        ),
    ),
    (
        "orphan_daemon_thread",
        "import ctypes, threading, time\n"
        "def spin():\n"
        "    ctypes.CDLL(None).prctl(15, {marker!r}.encode())\n"
        "    time.sleep(100)\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "time.sleep(0.3)\n"
        "print('left it')",
        None,
        lambda r, ctx: r.status == "ok" and r.stdout == "left it\n",
    ),
    (
        "orphan_thread_never_ends",
        "import ctypes, threading, time\n"
        "def spin():\n"
        "    ctypes.CDLL(None).prctl(15, {marker!r}.encode())\n"
        "    time.sleep(100)\n"
        "threading.Thread(target=spin).start()\n"
        "print('waiting')",
        None,
        lambda r, ctx: r.status == "timeout" and r.stdout == "waiting\n",
    ),
]


@pytest.mark.parametrize("name,code,layer,check", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_program_is_contained_and_the_runner_goes_on(
    runner, victim, tmp_path, name, code, layer, check
):
    if layer and not runner.layers.get(layer):
        pytest.skip(f"this machine lacks the {layer} layer: {runner.missing}")
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    victim_file = tmp_path / "victim.txt"  # owned by the test's user, as the trainer's files are
    victim_file.write_text("hello")
    victim_file.chmod(0o644)
    os.setxattr(victim_file, "user.keep", b"1")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "sock"))
    listener.listen(1)
    listener.setblocking(False)
    ctx = {
        "victim": victim.pid,
        "victim_nofile": _nofile(victim.pid),
        "victim_file": str(victim_file),
        "victim_mtime": victim_file.stat().st_mtime_ns,
        "sock": str(tmp_path / "sock"),
        "listener": listener,
        "secret": str(secret),
        "secret_text": "the host's secret",
        "tmp": str(tmp_path),
        "outside": str(tmp_path / "pwned.txt"),
        "test_pid": os.getpid(),
        "marker": f"dapo-{name[:9]}"[:15],
    }
    (template,) = runner.pids
    (inner,) = _descendants(template)  # the template proper, below its launcher; programs run below it
    try:
        (r,) = runner.run([code.format(**ctx)])
        assert check(r, ctx), r
    finally:
        listener.close()
    assert SECRET_VALUE not in r.stdout + r.stderr
    # contained: the template lives on, nothing of the program is left running, the next program runs
    assert runner.pids == [template] and _descendants(template) == [inner]
    assert not threads_named(ctx["marker"])
    assert [(x.status, x.stdout) for x in runner.run(["print(1+1)"])] == [("ok", "2\n")]


def test_cpu_time_past_cpu_s_is_killed_by_sigxcpu_before_the_wall_time():
    with ProgramRunner(1, ProgramLimits(wall_s=10.0, cpu_s=1.0)) as r:
        t0 = time.monotonic()
        (res,) = r.run(["while True:\n    pass"])
        elapsed = time.monotonic() - t0
        assert (res.status, res.detail) == ("killed", "SIGXCPU")
        assert 1.0 <= res.wall_s < 10.0 and elapsed < 10.0
        assert r.run(["print('next')"])[0].stdout == "next\n"


def test_a_template_killed_from_outside_costs_its_call_a_sandbox_error_and_is_replaced():
    marker = "dapo-victim"
    with ProgramRunner(1, ProgramLimits(wall_s=10.0)) as r:
        (old,) = r.pids
        killer = threading.Timer(1.0, os.kill, (old, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        program = (
            f"import ctypes, time\nctypes.CDLL(None).prctl(15, {marker!r}.encode())\ntime.sleep(8)\nprint(0)"
        )
        (res,) = r.run([program])
        elapsed = time.monotonic() - t0
        killer.join()
        assert res.status == "sandbox_error" and res.detail.startswith("the sandbox template died")
        assert res.stdout == "" and elapsed < 5.0
        (new,) = r.pids
        assert new != old
        assert [(x.status, x.stdout) for x in r.run(["print(1+1)"])] == [("ok", "2\n")]
        os.kill(
            new, signal.SIGKILL
        )  # killed while idle: the next program never started there, and runs on a fresh one
        time.sleep(0.2)
        assert [(x.status, x.stdout) for x in r.run(["print(3)"])] == [("ok", "3\n")]
        assert r.pids != [new]
        deadline = time.monotonic() + 5  # the orphaned program dies with its template (PDEATHSIG)
        while threads_named(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not threads_named(marker)


def test_results_come_back_in_input_order_from_both_templates():
    programs = [
        f"import os, time\ntime.sleep({0.3 if i % 3 == 0 else 0.0})\nprint({i}, os.getcwd())"
        for i in range(12)
    ]
    with ProgramRunner(2, ProgramLimits(wall_s=5.0)) as r:
        res = r.run(programs)
        workroots = {t.workroot for t in r._slots}
    assert [x.stdout.split()[0] for x in res] == [str(i) for i in range(12)]
    # each template's working directory: both ran programs
    assert {x.stdout.split()[1] for x in res} == workroots and len(workroots) == 2
    assert all(x.status == "ok" for x in res)
    assert r.pids == []
    with pytest.raises(RuntimeError, match="closed"):
        r.run(["print(1)"])


def test_the_template_environment_and_the_read_allow_list():
    paths = python_install_paths()
    assert "/" not in paths and all(os.path.exists(p) for p in paths) and len(paths) == len(set(paths))
    assert os.path.realpath(os.path.dirname(os.__file__)) in paths  # the standard library
    with ProgramRunner(1) as r:
        assert r.missing == [] or all(isinstance(m, str) for m in r.missing)
        assert set(r.layers) == {"rlimits", "files", "reads", "network", "processes", "isolation", "disk"}
        (template,) = r.pids
        env = Path(f"/proc/{template}/environ").read_bytes().split(b"\0")
        assert sorted(e.split(b"=")[0] for e in env if e) == [b"LANG", b"PATH", b"TMPDIR"]
        (res,) = r.run(["import numpy\nprint(numpy.arange(4).sum())"])  # site-packages are readable
        assert (res.status, res.stdout) == ("ok", "6\n")


def test_dapo_sandbox_prints_one_json_object(capsys, tmp_path):
    assert main(["sandbox", "-c", "print(6 * 7)"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: out[k] for k in ("status", "stdout", "stderr", "truncated", "detail")} == {
        "status": "ok",
        "stdout": "42\n",
        "stderr": "",
        "truncated": False,
        "detail": "",
    }
    assert (
        set(out["layers"]) == {"rlimits", "files", "reads", "network", "processes", "isolation", "disk"}
        and "missing" in out
    )
    prog = tmp_path / "p.py"
    prog.write_text("import sys\nprint(input()[::-1])\nsys.exit(3)")
    assert (
        main(["sandbox", "--file", str(prog), "--stdin", "abc\n"]) == 0
    )  # the program failed, the sandbox did not
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["stdout"], out["detail"]) == ("error", "cba\n", "exit status 3")
    assert main(["sandbox", "-c", "import time\ntime.sleep(5)", "--timeout-s", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "timeout"


def test_the_template_sees_the_host_read_only_and_without_set_user_id(runner):
    """The template's mount namespace: every mount read-only and nosuid (the program's owner rights on host files
    change nothing), but for the working directory's tmpfs while a call runs."""
    (template,) = runner.pids
    mounts = [line.split() for line in Path(f"/proc/{template}/mountinfo").read_text().splitlines()]
    assert mounts
    writable = [m[4] for m in mounts if not {"ro", "nosuid"} <= set(m[5].split(","))]
    assert writable == []


def test_sysv_shared_memory_does_not_outlive_the_call(runner):
    """No SysV IPC (seccomp), and an IPC namespace per template: nothing a program makes outlives it on the host."""
    key = 0x5D000000 | (os.getpid() & 0xFFFFF)
    make = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"shmid = libc.shmget({key}, 1 << 20, 0o1600)\n"  # IPC_CREAT | 0600
        "print(shmid >= 0, ctypes.get_errno())"
    )
    (template,) = runner.pids
    try:
        (res,) = runner.run([make])
        assert (res.status, res.stdout) == ("ok", "False 1\n")  # EPERM
        keys = [line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
        assert str(key) not in keys
        assert os.readlink(f"/proc/{template}/ns/ipc") != os.readlink("/proc/self/ns/ipc")
    finally:  # what the bug left on the host
        for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
            if line.split()[0] == str(key):
                ctypes.CDLL(None).shmctl(int(line.split()[1]), 0, None)  # IPC_RMID


def test_a_program_cannot_spoil_the_working_directory_of_the_next(runner):
    """Each call gets a fresh tmpfs: a directory made unremovable, nesting too deep to remove recursively, and
    inodes by the thousand leave the next program its whole disk."""
    fill = "for i in range(4):\n    open(f'd/f{i}', 'wb').write(b'x' * (15 << 20))\n"
    locked = "import os\nos.mkdir('d')\n" + fill + "os.chmod('d', 0o500)"
    deep = "import os\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
    many = (
        "import os\nn = 0\ntry:\n    while True:\n        open(f'{n}', 'w').close()\n        n += 1\n"
        "except OSError as e:\n    print(n, e.errno)"
    )
    again = "import os\nos.mkdir('d')\n" + fill + "print(len(os.listdir('.')), len(os.listdir('d')))"
    (template,) = runner.pids
    res = runner.run([locked, again, deep, again, many, again])
    assert res[0].status == "error" and _stderr_last_line(res[0]).startswith("PermissionError")  # no chmod
    assert (res[2].status, res[2].stdout) == ("ok", "deep\n")
    n, err = res[4].stdout.split()
    assert res[4].status == "ok" and err == "28" and 1000 < int(n) < TABLE_LIMITS.disk_files
    assert [(x.status, x.stdout) for x in res[1::2]] == [("ok", "1 4\n")] * 3
    assert runner.pids == [template]


def test_a_program_finds_no_other_call_s_data_in_its_process(runner):
    """The child is a fork of the template: nothing of an earlier call (its result) is left where a program could
    walk to it (its callers' frames, the objects the garbage collector knows)."""
    first = (
        "print('EARLIER' + '-CALL-' + 'OUTPUT')"  # the marker is folded at compile time, never in a source
    )
    look = textwrap.dedent(
        """\
        import gc, sys
        m = ''.join(['EARLIER', '-CALL-', 'OUTPUT'])
        def has(v, depth=0):
            if v is m:
                return False
            if isinstance(v, str):
                return m in v
            if isinstance(v, (bytes, bytearray)):
                return m.encode() in v
            if depth < 3 and isinstance(v, dict):
                return any(has(x, depth + 1) for x in [*v.keys(), *v.values()])
            if depth < 3 and isinstance(v, (list, tuple)):
                return any(has(x, depth + 1) for x in v)
            return False
        found, f = [], sys._getframe()
        while f is not None:
            if any(has(v) for v in f.f_locals.values()):
                found.append(f.f_code.co_name)
            f = f.f_back
        print(found + [type(o).__name__ for o in gc.get_objects() if has(o)])
        """
    )
    res = runner.run([first, look])
    assert [(x.status, x.stdout) for x in res] == [("ok", "EARLIER-CALL-OUTPUT\n"), ("ok", "[]\n")]


def test_killing_the_template_mid_call_leaves_no_process_of_the_program():
    """The program clears its parent-death signal: its PID namespace still ends with the template."""
    marker = "dapo-orphan"
    with ProgramRunner(1, ProgramLimits(wall_s=10.0)) as r:
        (old,) = r.pids
        killer = threading.Timer(1.0, os.kill, (old, signal.SIGKILL))
        killer.start()
        program = (
            "import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.prctl(1, 0)\n"
            f"libc.prctl(15, {marker!r}.encode())\ntime.sleep(8)"
        )
        (res,) = r.run([program])
        killer.join()
        assert res.status == "sandbox_error"
        deadline = time.monotonic() + 3
        while threads_named(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threads_named(marker) == []


def test_a_runner_started_in_a_thread_that_ended_keeps_its_templates():
    """A template does not die with the thread that started it (the parent-death signal follows the thread)."""
    box: dict = {}
    starter = threading.Thread(
        target=lambda: box.setdefault("r", ProgramRunner(1, ProgramLimits(wall_s=5.0)))
    )
    starter.start()
    starter.join()
    r = box["r"]
    try:
        (pid,) = r.pids
        time.sleep(0.5)
        out: list = []
        user = threading.Thread(target=lambda: out.extend(r.run(["print(1)"])))
        user.start()
        user.join()
        assert [(x.status, x.stdout) for x in out] == [("ok", "1\n")]
        assert r.pids == [pid]
    finally:
        r.close()


def test_no_process_group_is_signalled_after_its_template_was_reaped(monkeypatch):
    """A reaped template's pid (its process group's id) may already be another process's."""
    r = ProgramRunner(1, ProgramLimits(wall_s=5.0))
    (t,) = r._slots
    calls, real = [], os.killpg

    def spy(pgid, sig):
        calls.append((pgid, t.proc.returncode))
        return real(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    r.close()
    assert t.proc.returncode is not None
    assert [rc for _, rc in calls if rc is not None] == []


def test_a_template_stopped_while_it_starts_prints_no_traceback(capfd):
    from dapo_rl.sandbox.program import _Template

    t = _Template()
    t.stop()  # its pipes closed at once: it writes its ready line to no reader
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err


_CONFINED_CHILD = """
import json, os, sys
abi, seccomp, work, victim = sys.argv[1:]
from dapo_rl.sandbox import confinement
if abi != "None":
    import landlockpy._syscall
    landlockpy._syscall.abi_version = lambda: int(abi)
if seccomp != "True":
    confinement._seccomp = lambda *a, **k: "no seccomp filter (switched off by the test)"
c = confinement.confine(work, unshare_network=False)
try:
    os.truncate(victim, 0)
    done = True
except OSError as e:
    done = e.errno
print(json.dumps({"files": c.files, "missing": c.missing(), "truncate": done}))
"""


def _confined_child(tmp_path: Path, abi: int | None, seccomp: bool) -> dict:
    """`confine` in a fresh interpreter (not a fork of the test process, which holds earlier tests' threads and
    state) whose Landlock claims ABI `abi` (None: the kernel's), with or without its seccomp filter: the ``files``
    layer it reports, its notes, and what ``truncate(2)`` did to a file outside its directory (True: truncated;
    else the errno)."""
    import subprocess
    import sys

    victim = tmp_path / f"victim-{abi}-{seccomp}.txt"
    victim.write_text("hello")
    work = tmp_path / f"work-{abi}-{seccomp}"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _CONFINED_CHILD, str(abi), str(seccomp), str(work), str(victim)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["size"] = victim.stat().st_size
    return out


def landlockpy_abi() -> int:
    import landlockpy

    return landlockpy.abi_version()


def test_the_files_layer_is_complete_only_where_truncation_is_denied(tmp_path):
    """Landlock handles truncate(2) from ABI 3; below it, only the seccomp filter stops it."""
    old_with_filter = _confined_child(tmp_path, 2, seccomp=True)
    assert (old_with_filter["files"], old_with_filter["truncate"], old_with_filter["size"]) == (True, 1, 5)
    old_alone = _confined_child(tmp_path, 2, seccomp=False)
    assert (old_alone["files"], old_alone["truncate"], old_alone["size"]) == (False, True, 0)
    assert any("truncat" in m for m in old_alone["missing"])
    if landlockpy_abi() >= 3:
        new_alone = _confined_child(tmp_path, None, seccomp=False)
        assert (new_alone["files"], new_alone["truncate"], new_alone["size"]) == (True, 13, 5)


def test_a_filter_compiled_ahead_is_the_one_built_for_the_pid():
    """`compile_seccomp` with the pid filled in, byte for byte the filter `confine` would build for that pid."""
    from dapo_rl.sandbox import confinement

    program = bytearray(confinement.compile_seccomp(self_signals_only=True, deny_metadata=True))
    ks = memoryview(program).cast("I")[1::2]
    for i, k in enumerate(ks):
        if k == confinement._PID_PLACEHOLDER:
            ks[i] = 4242
    direct = confinement._filter(True, True, 4242)
    fd = os.memfd_create("test-bpf")
    with os.fdopen(fd, "w+b") as f:
        direct.export_bpf(f)
        f.seek(0)
        assert bytes(program) == f.read()


def test_a_template_that_cannot_clean_up_answers_then_retires(monkeypatch, tmp_path):
    """The call is answered (its program ran); the template says it retires, and the runner takes the answer."""
    import io
    from dataclasses import asdict

    from dapo_rl.sandbox import program, program_template

    place = program_template.Place(
        netns=False,
        sealed=False,
        disk=False,
        pidns=False,
        ipcns=False,
        read_paths=python_install_paths(),
        workroot=str(tmp_path),
    )

    def rmtree(path):
        raise RecursionError("maximum recursion depth exceeded")

    sent: list = []
    monkeypatch.setattr(program_template.shutil, "rmtree", rmtree)
    monkeypatch.setattr(program_template, "_send", sent.append)
    request = {"code": "print(1)", "limits": asdict(ProgramLimits())}
    stdin = io.BytesIO(json.dumps(request).encode() + b"\n")
    assert program_template._serve_one(stdin, place) is False
    (answer,) = sent
    assert (answer["status"], answer["stdout"]) == ("ok", "1\n") and "RecursionError" in answer["retire"]
    assert program._result(answer, ProgramLimits()).stdout == "1\n"
