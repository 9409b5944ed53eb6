"""The program sandbox (`dapo_rl.sandbox.program`) with real template processes and real programs, no mocks: what a
program prints and how it ended, a table of hostile programs each contained (the runner usable after each, nothing
of the program left running), a template killed from outside, the results' order, `dapo sandbox -c`."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

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


def _threads_named(name: str) -> list[str]:
    """The /proc/<pid>/task/<tid> of every thread on the machine whose name (comm) is `name`."""
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == name:
                    hits.append(f"/proc/{pid}/task/{tid}")
            except OSError:
                pass
    return hits


def _stderr_last_line(r) -> str:
    return r.stderr.rstrip("\n").splitlines()[-1]


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


def _row_write(r, ctx) -> bool:
    denied = _stderr_last_line(r).startswith("PermissionError: [Errno 13] Permission denied")
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
        "a = []\nwhile True:\n    a.append(bytearray(10**7))",
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
def test_a_hostile_program_is_contained_and_the_runner_goes_on(runner, tmp_path, name, code, layer, check):
    if layer and not runner.layers.get(layer):
        pytest.skip(f"this machine lacks the {layer} layer: {runner.missing}")
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    ctx = {
        "secret": str(secret),
        "secret_text": "the host's secret",
        "tmp": str(tmp_path),
        "outside": str(tmp_path / "pwned.txt"),
        "test_pid": os.getpid(),
        "marker": f"dapo-{name[:9]}"[:15],
    }
    (template,) = runner.pids
    (r,) = runner.run([code.format(**ctx)])
    assert check(r, ctx), r
    assert SECRET_VALUE not in r.stdout + r.stderr
    # contained: the template lives on, nothing of the program is left running, the next program runs
    assert runner.pids == [template] and _descendants(template) == []
    assert not _threads_named(ctx["marker"])
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
        while _threads_named(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _threads_named(marker)


def test_results_come_back_in_input_order_from_both_templates():
    programs = [
        f"import os, time\ntime.sleep({0.3 if i % 3 == 0 else 0.0})\nprint({i}, os.getppid())"
        for i in range(12)
    ]
    with ProgramRunner(2, ProgramLimits(wall_s=5.0)) as r:
        res = r.run(programs)
        pids = set(r.pids)
    assert [x.stdout.split()[0] for x in res] == [str(i) for i in range(12)]
    assert {int(x.stdout.split()[1]) for x in res} == pids and len(pids) == 2  # the parent is a template
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
        assert set(r.layers) == {"rlimits", "files", "reads", "network", "processes", "disk"}
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
        set(out["layers"]) == {"rlimits", "files", "reads", "network", "processes", "disk"}
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
