"""User reward functions (verl's signature) for the reward-pool tests, loaded by `module:function` names."""


def hang(data_source, solution_str, ground_truth, extra_info=None):
    """A verifier that never returns unless the response says "fast"."""
    if "fast" in solution_str:
        return 1.0
    while True:
        pass


def hang_or_die(data_source, solution_str, ground_truth, extra_info=None):
    """`hang` that also ends its worker's process at once (a crash in native code, the kernel's OOM killer) when the
    response says "die"; otherwise the response's number when it says "fast"."""
    import os

    if "die" in solution_str:
        os._exit(3)
    if "fast" in solution_str:
        return float(solution_str.split()[-1])
    while True:
        pass


def huge_pred(data_source, solution_str, ground_truth, extra_info=None):
    """`exact`, with a 2 MiB `pred` when the response says "huge" (a result over the pool's MAX_RESULT_BYTES)."""
    if "huge" in solution_str:
        return {"score": 1.0, "acc": True, "pred": "x" * (2 << 20)}
    return exact(data_source, solution_str, ground_truth, extra_info)


def exact(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response equals the ground truth, else -1 (a dict result with its own pred)."""
    ok = solution_str.strip() == str(ground_truth)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": solution_str.strip()}


def escape(data_source, solution_str, ground_truth, extra_info=None):
    """A scorer that does what a scorer evaluating model text could be made to do: each way out of the sandbox
    named in `solution_str` is tried, and what happened is returned in `pred` as JSON (`ok` or the error's name).
    `ground_truth` is a path outside the worker's directory."""
    import json
    import os
    import socket
    import subprocess
    import threading

    from sandbox_targets import inherited_fds

    def attempt(fn):
        try:
            fn()
            return "ok"
        except BaseException as e:  # noqa: BLE001
            return type(e).__name__

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def thread():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()

    out = {
        "write_outside": attempt(lambda: open(ground_truth, "w").write("x")),
        "write_inside": attempt(lambda: open("inside.txt", "w").write("x")),
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", int(solution_str)), timeout=2)),
        "fork": attempt(fork),
        "exec": attempt(lambda: subprocess.run(["/bin/true"], check=True)),
        "thread": attempt(thread),
        "signal_parent": attempt(lambda: os.kill(os.getppid(), 0)),
        "unix_socket": attempt(
            lambda: socket.socket(socket.AF_UNIX)
        ),  # multiprocessing's fork server listens on one
        "inherited_fds": inherited_fds(),
    }
    return {"score": -1.0, "acc": False, "pred": json.dumps(out)}


class _RunsWhenUnpickled:
    """An object whose unpickling runs a command: what a worker that ran code could try to send back."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


def unpickle_bomb(data_source, solution_str, ground_truth, extra_info=None):
    """A result carrying `_RunsWhenUnpickled(ground_truth)`: the trainer must read it as data."""
    return {"score": -1.0, "acc": False, "pred": "x", "payload": _RunsWhenUnpickled(ground_truth)}
