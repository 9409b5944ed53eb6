"""No model answer is executed while scoring: the answer grammars in front of reasoning-gym's text-evaluating scorers,
the registry-wide audit, and the scoring workers' OS confinement (`dapo_rl.sandbox`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import reasoning_gym

from dapo_rl.reward.answer_grammar import EVALUATING_TASKS, LITERAL, refusal
from dapo_rl.reward.pool import RewardPool, summarize
from dapo_rl.reward.reasoning_gym import score_answer_fn
from dapo_rl.reward.score import compute_score, evaluates_text
from dapo_rl.sandbox import confine

TESTS = Path(__file__).parent


def _entry(task: str, seed: int = 0) -> dict:
    return reasoning_gym.create_dataset(task, size=1, seed=seed)[0]


def _payloads(target: Path) -> list[str]:
    """Answers that would create `target` if evaluated (as sympy's parse_expr or Python's eval input)."""
    return [
        f"open('{target}', 'w').write('x')",
        f"__import__('os').system('touch {target}')",
        f"[open('{target}', 'w')]",
        f"(1, open('{target}', 'w'))",
    ]


# ---------------------------------------------------------------------------------------------- the grammars
@pytest.mark.parametrize(
    "task, answer, metadata, refused",
    [
        ("countdown", "94*4 - 61 - 6", {}, False),
        ("countdown", "(94 - 61) * 6 ^ 2 ** 1", {}, False),
        ("countdown", "94*4 - x", {}, True),  # no names in arithmetic
        ("countdown", "1 .real", {}, True),
        ("countdown", "1..__class__", {}, True),
        ("countdown", "open('f','w')", {}, True),
        ("puzzle24", "(8-5)*10 - 6", {}, False),
        ("puzzle24", "lambda: 1", {}, True),
        ("polynomial_multiplication", "-896*z**5 + 3*z", {"variables": ["z"]}, False),
        ("polynomial_multiplication", "-896*x**5", {"variables": ["z"]}, True),  # not the task's variable
        ("simple_integration", "-34*X**8/15 + C", {"variable": "X"}, False),
        ("intermediate_integration", "-cos(x) + exp(2*x)/2 + log(x) + C", {"variable": "x"}, False),
        ("intermediate_integration", "Integral(sin(x), x) + C", {"variable": "x"}, False),
        ("intermediate_integration", "exec(x)", {"variable": "x"}, True),
        ("intermediate_integration", "sin.__globals__", {"variable": "x"}, True),
        ("simple_integration", "x" + "(" * 31 + ")" * 31, {"variable": "x"}, True),  # too deep
        ("simple_integration", "x+" * 600 + "x", {"variable": "x"}, True),  # too long
        ("spiral_matrix", "[1, 2, -3, 4.5]", {}, False),
        ("spiral_matrix", "1 2 3 4", {}, False),  # not Python: eval fails before running anything
        ("spiral_matrix", "[1, 2] * 10**9", {}, True),
        ("binary_matrix", "[[0, 1], (1, 0)]", {}, False),
        ("binary_matrix", "[__import__('os')]", {}, True),
        ("string_insertion", "['A', 'B', 'C']", {}, False),
        ("string_insertion", "f'{1}'", {}, True),  # an f-string runs code
        ("string_insertion", "ABCDE", {}, True),  # a name
        ("n_queens", "_ Q _ _\n_ _ _ Q", {}, False),
        ("n_queens", "[x for x in ()]", {}, True),
        ("chain_sum", "open('f')", {}, False),  # its scorer evaluates nothing: no grammar
    ],
)
def test_answer_grammar_by_hand(task, answer, metadata, refused):
    assert (refusal(task, answer, "GOLD", metadata) is not None) is refused


TOWERS = ["9**9**9**9**9", "99999999999**99999999999", "2^2^2^2^2^2"]


@pytest.mark.parametrize("answer", TOWERS)
def test_power_towers_are_refused_in_well_under_a_second(answer):
    """Each of these passed the grammar and then cost the scorer its whole time-out and a worker kill."""
    e = _entry("countdown")
    t0 = time.perf_counter()
    reason = refusal("countdown", answer, e["answer"], e["metadata"])
    res = compute_score("reasoning_gym/countdown", f"Answer: {answer}", e["answer"], e)
    took = time.perf_counter() - t0
    assert reason == "an exponent of more than 4 digits"
    assert res["score"] == -1.0 and res["refused"] is True and not res["acc"]
    assert took < 0.1, took
    # the same towers in an algebra task, and with a variable in the exponent
    assert refusal("polynomial_multiplication", answer, "x**2", {"variables": ["x"]}) == reason
    assert refusal("polynomial_multiplication", "x**x**x", "x**2", {"variables": ["x"]}) == (
        "an exponent with a symbolic power of its own (a power tower)"
    )


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("2^2^2^2", None),  # 2**16: small, computed and kept
        ("(94 - 61) * 6 ^ 2 ** 1", None),
        ("2**9999", None),  # 3010 digits
        ("(9**9999)**9999", "a power of more than 10000 digits"),
        ("9999**9999", "a power of more than 10000 digits"),
        ("2**(9999*9999)", "an exponent of more than 4 digits"),
        ("2**-99999", "an exponent of more than 4 digits"),
        ("x**(2**3) + x**(1/2)", None),
        ("(x + 1)**99999", "an exponent of more than 4 digits"),
        (
            "x**(x**2 + 3*x)",
            None,
        ),  # a symbolic exponent holding a number power: E**(8*x**2 - 8*x) in integration
        ("x**(2**x)", "an exponent with a symbolic power of its own (a power tower)"),
        # / and + are bounded as * is (review B1's m1: 1/(6**9999/(1/6**9999)/...) cost 1.6 s here, 5.7 s in sympy)
        ("1/(6**9999" + "/(1/6**9999)" * 36 + ")", "a number of more than 10000 digits"),
        ("1/7**6000 + 1/11**6000", "a number of more than 10000 digits"),
        ("2**9999 + 1/3", None),
    ],
)
def test_powers_are_bounded_by_value(answer, reason):
    assert refusal("polynomial_multiplication", answer, "x**2", {"variables": ["x"]}) == reason


def test_the_e_power_form_the_integration_prompts_suggest_is_right():
    """intermediate_integration's prompt says "Use `exp(x)` or `E**(x)`": golds with exp(<polynomial>) written as
    E**(...) are in the grammar and score +1 (review of this change, B1: they were refused as power towers)."""
    entries = [
        e
        for e in reasoning_gym.create_dataset(
            "intermediate_integration",
            size=60,
            seed=1,
            problem_types=["exponential"],
            problem_type_weights=[1.0],
        )
        if "exp(" in e["answer"] and "**2" in e["answer"]
    ]
    assert len(entries) >= 5
    for e in entries:
        alt = e["answer"].replace("exp(", "E**(")
        res = compute_score("reasoning_gym/intermediate_integration", f"Answer: {alt}", e["answer"], e)
        assert res["score"] == 1.0 and "refused" not in res, (alt, res)


def test_the_gold_always_passes_and_composite_resolves_its_task():
    assert refusal("string_insertion", "ABCDE", "ABCDE", {}) is None
    assert refusal("composite", "open('f')", "7", {"source_dataset": "countdown"}) is not None
    assert refusal("composite", "open('f')", "7", {"source_dataset": "chain_sum"}) is None
    assert evaluates_text("auto", "reasoning_gym/countdown") and not evaluates_text(
        "auto", "reasoning_gym/chain_sum"
    )
    assert evaluates_text("reasoning_gym", "x", {"metadata": {"source_dataset": "n_queens"}})
    assert not evaluates_text("math", "reasoning_gym/countdown")


@pytest.mark.parametrize("task", sorted(EVALUATING_TASKS))
def test_reference_answers_are_in_the_grammar_and_score_right(task):
    """Each task's golds of 40 generated entries: never refused (the expression tasks' given as a not-verbatim copy,
    so the grammar itself decides; a literal task's scorer takes its gold verbatim), and fully right by the task's
    scorer behind the guard."""
    for e in reasoning_gym.create_dataset(task, size=40, seed=11):
        gold, meta = e["answer"], e["metadata"]
        assert refusal(task, gold if task in LITERAL else gold + " ", gold, meta) is None, gold
        assert score_answer_fn(task)(gold, e) == 1.0
        if "\n" not in gold:  # one "Answer:" line holds it (binary_matrix and n_queens golds span lines)
            res = compute_score(f"reasoning_gym/{task}", f"Answer: {gold}", gold, e)
            assert res["score"] == 1.0 and "refused" not in res, (gold, res)


# ------------------------------------------------------------------------------- payloads, in and out of process
@pytest.mark.parametrize("where", ["in_process", "pool", "pool_num_workers_0"])
def test_answers_that_would_write_a_file_write_none(tmp_path, where):
    """Per task, in the trainer's process (`compute_score`), through the pool's workers and through the pool with
    `num_workers=0`: every payload is refused (-1, `refused`), nothing is written, the golds still score +1."""
    items, expect = [], []
    for task in sorted(EVALUATING_TASKS):
        e = _entry(task)
        target = tmp_path / f"{task}.pwned"
        for p in _payloads(target):
            items.append((f"reasoning_gym/{task}", f"Answer: {p}", e["answer"], e))
            expect.append("refused")
        if "\n" not in e["answer"]:
            items.append((f"reasoning_gym/{task}", f"Answer: {e['answer']}", e["answer"], e))
            expect.append("right")
    if where == "in_process":
        results = [compute_score(*it) for it in items]
    else:
        with RewardPool("auto", 1 if where == "pool" else 0, 10.0) as pool:
            results = pool.score(items)
    for it, want, res in zip(items, expect, results):
        if want == "refused":
            assert res["score"] == -1.0 and res.get("refused") is True, (it[1], res)
        else:
            assert res["score"] == 1.0 and not res.get("refused"), (it[1], res)
    assert list(tmp_path.iterdir()) == []
    n_refused = expect.count("refused")
    assert summarize(results)["reward/refused_rate"] == pytest.approx(n_refused / len(items))


_SWEEP = textwrap.dedent(
    """
    import json, sys
    MARK = "dapoPAYLOADmark"
    hits, current = set(), [None]

    def names(code):
        out = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}
        for c in code.co_consts:
            if hasattr(c, "co_names"):
                out |= names(c)
        return out

    def hook(event, args):  # every eval/exec of a code object, whoever calls it (sympy's parse_expr included)
        if event == "exec" and args and hasattr(args[0], "co_names") and any(MARK in n for n in names(args[0])):
            hits.add(current[0])

    sys.addaudithook(hook)
    import reasoning_gym
    from reasoning_gym.factory import DATASETS
    import dapo_rl.reward.reasoning_gym as rgv

    if sys.argv[1] == "unguarded":
        rgv.refusal = lambda *a, **k: None
    payloads = [MARK + "()", "[" + MARK + "]", "(1, " + MARK + ")", MARK + ".x", "-" + MARK, MARK + "**2"]
    tasks = 0
    for name in sorted(DATASETS):
        try:
            e = reasoning_gym.create_dataset(name, size=1, seed=0)[0]
        except Exception:  # composite needs a config of its own
            continue
        tasks += 1
        current[0] = name
        for p in payloads:
            rgv.compute_score_reasoning_gym(name, "Answer: " + p, e["answer"], e)
    print(json.dumps({"tasks": tasks, "evaluated": sorted(hits)}))
    """
)


def test_every_reasoning_gym_scorer_is_audited():
    """The whole reasoning-gym registry, under an audit hook on every code object executed: without the guard
    exactly `EVALUATING_TASKS` evaluate a payload answer (so the list is complete), with it none does."""
    out = {}
    for mode in ("unguarded", "guarded"):
        proc = subprocess.run(
            [sys.executable, "-c", _SWEEP, mode], capture_output=True, text=True, timeout=300, check=True
        )
        last = proc.stdout.strip().splitlines()[-1]  # a task's generator prints dots of its own
        out[mode] = json.loads(last[last.index("{") :])
    assert out["guarded"]["tasks"] >= 100
    assert set(out["unguarded"]["evaluated"]) == EVALUATING_TASKS
    assert out["guarded"]["evaluated"] == []


# ------------------------------------------------------------------------------------------------- the sandbox
def _free_listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_a_pool_worker_is_confined(tmp_path):
    """A scorer run in a pool worker (a user function doing what evaluated model text could do): it writes only in
    its own directory, reaches no listening local port, starts no process, runs no program, signals nobody outside;
    threads still work. The worker's directory is removed with the pool."""
    outside = tmp_path / "outside.txt"
    listener = _free_listener()
    try:
        with RewardPool("reward_fixtures:escape", 1, 20.0) as pool:
            workdir = pool._sandbox.workers[0].workdir
            res = pool.score([("x", str(listener.getsockname()[1]), str(outside), None)])[0]
    finally:
        listener.close()
    got = json.loads(res["pred"])
    assert len(got.pop("inherited_fds")) == 1  # its pipe to the pool, nothing the fork server handed it
    assert got == {
        "write_outside": "PermissionError",
        "write_inside": "ok",
        "connect": got["connect"],
        "fork": "PermissionError",
        "exec": "PermissionError",
        "thread": "ok",
        "signal_parent": "PermissionError",
        "unix_socket": "PermissionError",
    }
    assert got["connect"] in ("PermissionError", "OSError", "ConnectionRefusedError")
    assert not outside.exists() and not Path(workdir).exists()


@pytest.mark.skipif(os.getuid() != 0, reason="drops to an unprivileged user: needs root to do so")
def test_confinement_holds_for_an_unprivileged_user():
    """As a plain user (no capabilities): the network namespace comes from a user namespace, RLIMIT_NPROC and the
    filter stop processes, Landlock stops writes."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp())  # pytest's own is private to root
    work = tmp_path / "work"
    work.mkdir()
    for d in (tmp_path, work):
        os.chmod(d, 0o777)
    code = textwrap.dedent(
        f"""
        import json, os, socket
        import landlockpy, pyseccomp  # before the switch: this Python may live under root's home
        from dapo_rl.sandbox import confine
        os.setgid(65534); os.setuid(65534)
        c = confine({str(work)!r})
        def attempt(fn):
            try:
                fn(); return "ok"
            except BaseException as e:
                return type(e).__name__
        print(json.dumps({{
            "missing": c.missing(), "network": c.network, "files": c.files, "processes": c.processes,
            "write_outside": attempt(lambda: open({str(tmp_path / "x")!r}, "w").write("x")),
            "write_inside": attempt(lambda: open("in.txt", "w").write("x")),
            "fork": attempt(lambda: os.fork() or os._exit(0)),
        }}))
        """
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["missing"] == [] and got["network"] and got["files"] and got["processes"]
    assert (got["write_outside"], got["write_inside"], got["fork"]) == (
        "PermissionError",
        "ok",
        "PermissionError",
    )


def test_confine_reports_each_layer(tmp_path):
    """`confine` in a fresh child on this machine: every layer in place, nothing missing."""
    code = (
        f"import json; from dapo_rl.sandbox import confine; c = confine({str(tmp_path)!r}); "
        "print(json.dumps([c.rlimits, c.files, c.network, c.processes, c.missing()]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(proc.stdout) == [True, True, True, True, []]
    import dapo_rl.sandbox.confinement

    # `dapo_rl.sandbox.confine` is the package's name for the confinement module's function
    assert confine is dapo_rl.sandbox.confinement.confine


def test_what_a_worker_sends_back_is_read_as_data(tmp_path):
    """Review of issue 42, M1: a worker's result is JSON, never unpickled in the trainer: an object built to run
    a command when unpickled arrives as its text, and nothing runs."""
    marker = tmp_path / "ran-in-the-trainer"
    with RewardPool("reward_fixtures:unpickle_bomb", 1, 20.0) as pool:
        (res,) = pool.score([("x", "y", str(marker), None)])
    assert res["score"] == -1.0 and isinstance(res["payload"], str) and "RunsWhenUnpickled" in res["payload"]
    assert not marker.exists()
