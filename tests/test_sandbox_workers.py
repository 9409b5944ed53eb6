"""The sandbox's worker pool on its own (no rewards): results in order, a hard per-item deadline, a dead or lying
worker replaced, results read back as data, the workers confined."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_targets import act

from dapo_rl.sandbox import MAX_RESULT_BYTES, WorkerPool


def _echo(i, options=None):
    return {"echo": i, "options": {} if options is None else options}


def _without_pid(results):
    return [{k: v for k, v in r.items() if k != "pid"} for r in results]


def test_items_come_back_in_order_with_their_options_from_every_worker():
    items = [("echo", i) for i in range(50)]
    with WorkerPool(act, 2, 5.0) as pool:
        pids = {w.proc.pid for w in pool.workers}
        res = pool.run(items, {"tag": "a"})
        again = pool.run(items[:3])  # the same workers, no options: {}
        assert {w.proc.pid for w in pool.workers} == pids
    assert _without_pid(res) == [_echo(i, {"tag": "a"}) for i in range(50)]
    assert {r["pid"] for r in res} == pids and len(pids) == 2  # both workers took chunks
    assert _without_pid(again) == [_echo(i) for i in range(3)]
    assert pool.workers == [] and pool.run([]) == []
    with pytest.raises(RuntimeError, match="^the sandbox pool is closed$"):
        pool.run(items[:1])


def test_an_item_past_its_deadline_costs_one_timeout_and_the_later_items_are_answered():
    items = [("echo", 0), ("sleep", 60), ("echo", 2), ("echo", 3)]
    with WorkerPool(act, 1, 1.0, on_timeout=lambda t: {"timed_out_after": t}) as pool:
        first = pool.workers[0]
        t0 = time.monotonic()
        res = pool.run(items)
        elapsed = time.monotonic() - t0
        replacement = pool.workers[0]
    assert _without_pid(res) == [_echo(0), {"timed_out_after": 1.0}, _echo(2), _echo(3)]
    assert res[0]["pid"] == first.proc.pid and res[2]["pid"] == res[3]["pid"] == replacement.proc.pid
    assert replacement is not first and first.proc.exitcode == -signal.SIGKILL
    assert not Path(first.workdir).exists() and not Path(replacement.workdir).exists()
    assert 1.0 <= elapsed < 1.0 + 1.5  # one timeout, plus a fresh worker's start


def test_the_default_timeout_result_says_so():
    with WorkerPool(act, 1, 0.5) as pool:
        (res,) = pool.run([("sleep", 60)])
    assert res == {"error": "TimeoutError: no result within 0.5 s", "timeout": True}


def test_a_worker_that_dies_costs_only_its_item_and_is_replaced():
    items = [("echo", 0), ("die", 3), ("echo", 2), ("echo", 3)]
    with WorkerPool(act, 1, 5.0, on_error=lambda why: {"failed": why}) as pool:
        first = pool.workers[0]
        t0 = time.monotonic()
        res = pool.run(items)
        elapsed = time.monotonic() - t0
        replacement = pool.workers[0]
    assert _without_pid(res) == [_echo(0), {"failed": "worker died"}, _echo(2), _echo(3)]
    assert first.proc.exitcode == 3 and res[2]["pid"] == replacement.proc.pid != first.proc.pid
    assert elapsed < 5.0  # no deadline waited for


def test_a_result_over_max_result_bytes_is_an_error_and_its_neighbours_keep_theirs():
    items = [("echo", 0), ("huge", 2 * MAX_RESULT_BYTES), ("echo", 2), ("huge", 1000)]
    with WorkerPool(act, 1, 5.0) as pool:
        first = pool.workers[0].proc.pid
        res = pool.run(items)
    assert res[1] == {"error": f"result longer than {MAX_RESULT_BYTES} bytes"}
    assert _without_pid([res[0], res[2]]) == [_echo(0), _echo(2)] and res[3] == "x" * 1000
    assert res[0]["pid"] == first != res[2]["pid"]  # the pipe is out of step after it: a fresh worker


def test_a_target_that_raises_gets_an_error_result_and_its_worker_goes_on():
    with WorkerPool(act, 1, 5.0) as pool:
        res = pool.run([("echo", 0), ("raise", "no such thing"), ("echo", 2)])
    assert res[1] == {"error": "ValueError: no such thing"}
    assert res[0]["pid"] == res[2]["pid"]


def test_a_result_that_check_refuses_is_an_error_and_the_worker_is_replaced():
    def check(value):
        if value.get("echo") == "lie":
            raise ValueError("not what an echo sends")
        return value

    with WorkerPool(act, 1, 5.0, check=check, on_error=lambda why: {"failed": why}) as pool:
        res = pool.run([("echo", 0), ("echo", "lie"), ("echo", 2)])
    assert res[1] == {"failed": "ValueError: not what an echo sends"}
    assert res[0]["pid"] != res[2]["pid"]


def test_results_are_read_as_json_data():
    """What JSON cannot carry arrives as its text; nothing is unpickled."""
    with WorkerPool(act, 1, 5.0) as pool:
        (res,) = pool.run([("not_json", None)])
    assert res == {"fraction": "1/3", "set": "{7}"}


def test_a_worker_is_confined_ignores_sigterm_and_its_directory_goes_with_it(tmp_path):
    outside = tmp_path / "outside.txt"
    with WorkerPool(act, 1, 5.0, name="tool") as pool:
        w = pool.workers[0]
        assert Path(w.workdir).name.startswith("dapo-tool-") and Path(w.workdir).is_dir()
        os.kill(w.proc.pid, signal.SIGTERM)
        (res,) = pool.run([("where", str(outside))])
        assert pool.workers[0] is w and w.proc.is_alive()
    assert res["pid"] == w.proc.pid and res["cwd"] == w.workdir
    assert len(res["fds"]) == 1  # its pipe to the pool, nothing the fork server handed it
    assert res["write_outside"] == "PermissionError" and not outside.exists()
    assert not w.proc.is_alive() and not Path(w.workdir).exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0, "timeout_s": 1.0}, r"^num_workers=0 must be >= 1$"),
        ({"num_workers": 1, "timeout_s": float("nan")}, r"^timeout_s=nan must be a finite number > 0$"),
        ({"num_workers": 1, "timeout_s": float("inf")}, r"^timeout_s=inf must be a finite number > 0$"),
        ({"num_workers": 1, "timeout_s": 0.0}, r"^timeout_s=0.0 must be a finite number > 0$"),
    ],
)
def test_bad_sizes_are_refused_before_any_worker_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WorkerPool(act, **kwargs)


def test_the_sandbox_imports_nothing_of_rewards():
    """Neither the caller's process nor a worker imports `dapo_rl.reward` (a fresh interpreter, so that no earlier
    pool's preload is in its fork server)."""
    code = textwrap.dedent(
        """
        import json, sys
        from sandbox_targets import act
        from dapo_rl.sandbox import WorkerPool

        if __name__ == "__main__":
            with WorkerPool(act, 1, 30.0) as pool:
                (res,) = pool.run([("where", "/nonexistent/x")])
            here = sorted(m for m in sys.modules if m.startswith("dapo_rl"))
            print(json.dumps([here, res["dapo_rl_modules"]]))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    here, worker = json.loads(proc.stdout.splitlines()[-1])
    assert "dapo_rl.sandbox.workers" in here and "dapo_rl.sandbox.workers" in worker
    assert [m for m in here + worker if m.startswith("dapo_rl.reward")] == []


def test_a_pool_closed_during_a_run_ends_the_run_with_an_error_not_a_spin():
    """Review of issue 43, m1: `close` from another thread (a failing trainer closes the episode while its producer
    scores) used to leave `run` looping at full CPU forever; now the run raises within a second."""
    import threading

    pool = WorkerPool(act, 1, 30.0)
    outcome: list[BaseException | None] = []

    def go():
        try:
            pool.run([("sleep", 0.5)] * 8)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=go)
    t.start()
    time.sleep(1.2)
    cpu0, t0 = time.process_time(), time.monotonic()
    pool.close()
    t.join(timeout=3)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    assert isinstance(outcome[0], RuntimeError) and "closed during a run" in str(outcome[0])
    assert time.process_time() - cpu0 < 1.0  # no spin
