"""The code reward (`reward.name: code`): a response's last Python block, run in the sandbox against its row's
hidden tests, scored by the trainer's process from what the program returned.

Per response (`CodeScorer.score`):

1. the code: the last fenced block tagged ``python``, ``py``, ``python3`` or untagged (`last_code_block`); none:
   outcome ``no_code``;
2. the tests (`dapo_rl.reward.code.suites.parse_tests`); a row whose tests cannot be read is the data's fault: an
   ``error`` result (counted in `reward/error_rate`);
3. the programs, in `dapo_rl.sandbox.ProgramRunner` (each in a confined child: no network, no writes outside its
   own tmpfs, reads only under the Python installation, no processes, its output capped, killed at its wall time):
   - standard input/output tests: the code itself, once per test, the input on stdin, ``test_timeout_s`` each;
   - function tests: one program (`dapo_rl.reward.code.child.call_main`) that loads the code and calls the function
     on each test's arguments, ``test_timeout_s`` per call, writing only the values it got back;
   - HumanEval tests: the arguments the check passes are first recorded from the check alone, once per problem
     (`record_main`: no model code there), then the function is called on them as above, then the check is
     replayed in a third process against those values, as data (`replay_main`: no model code there either);
4. the comparison, here, on data: stdout against the expected output (`stdio_equal`), a decoded value against the
   expected one (`call_equal`), or the replayed check's verdict. A program's exit code, its own asserts and its own
   comparisons decide nothing, and the expected outputs never enter a sandboxed process that runs model code.

Outcomes (one per response, `CODE_OUTCOMES`): ``pass``, ``wrong``, ``compile_error``, ``runtime_error``,
``timeout``, ``sandbox_error`` (the sandbox failed: not the policy's doing, the response does not train),
``no_code``. Recognised hack attempts (`HACKS`) fail the response and are listed in its result: ``exit`` (SystemExit
or ``os._exit`` while being tested), ``tampered`` (builtins, the harness's functions, ``sys.exit``/``os.write``/
``json.dumps`` replaced), ``always_equal`` (a value of a class that overrides comparison or subclasses a built-in
type), ``flood`` (output past the cap), ``forged_report`` (lines in the harness's format that the harness did not
write).

Score: DAPO's ±1 (+1 when every test passes), or with ``pass_rate`` the share of tests passed on the same scale
(``2 * passed / total - 1``; Klear-Reasoner, arXiv 2508.07629, §3.2, where it helps; a HumanEval check is one test).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_rl.reward.code.child import decode, key_of
from dapo_rl.reward.code.suites import (
    CallTests,
    CheckTests,
    StdioTests,
    TestSuite,
    call_equal,
    parse_tests,
    stdio_equal,
)
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result

CODE_OUTCOMES = ("pass", "wrong", "compile_error", "runtime_error", "timeout", "sandbox_error", "no_code")
"""What became of a response under the code reward (the module docstring says when each)."""

HACKS = ("exit", "tampered", "always_equal", "flood", "forged_report")
"""Recognised hack attempts (the module docstring says what each is); each fails the response."""

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+#.-]*)[ \t]*\r?$")
_PYTHON_TAGS = ("python", "python3", "py")
_CHILD = (Path(__file__).with_name("child.py")).read_text(encoding="utf-8")
MAX_RECORDS = 4096
"""HumanEval problems whose recorded calls are kept (least recently used dropped)."""
LOAD_S = 5.0
"""Seconds a function test's module may take to load (its top-level code), on top of the tests' time."""
REPLAY_ROUNDS = 3
"""Replays of a HumanEval check before calls it made that were not recorded fail the response."""


def last_code_block(text: str) -> str | None:
    """The last fenced code block of a response tagged ``python``, ``python3`` or ``py``; else the last untagged one;
    None when there is none (an unclosed fence, as at the length limit, is none).

    Fences are read line by line, as LiveCodeBench's extraction does: a line that is three backticks and an optional
    tag opens a block, the next bare fence line closes it. So a ```` ```text ```` block before the code, or an
    untagged output block after it, never takes its place (verl's ``prime_code`` likewise takes the text after the
    last ```` ```python ````).

    Args:
        text: the decoded response.
    """
    tagged = untagged = None
    tag, body = None, []
    for line in (text or "").split("\n"):
        m = _FENCE.match(line)
        if tag is None:
            if m:
                tag, body = m.group(1).lower(), []
            continue
        if m and not m.group(1):  # a bare fence closes the open block
            block = "".join(x + "\n" for x in body)
            if tag in _PYTHON_TAGS:
                tagged = block
            elif not tag:
                untagged = block
            tag = None
            continue
        body.append(line)
    return tagged if tagged is not None else untagged


@dataclass(frozen=True)
class CodeLimits:
    """What the code reward's programs may use (`reward.code`).

    Attributes:
        test_timeout_s: seconds per test: a standard-input run's wall and CPU time; in the call program, a call's
            time (an alarm, and the call's measured time: a call that ignores or blocks the alarm and returns
            late is still a timeout).
        total_timeout_s: seconds all of one response's tests may take together: its call program is killed there,
            and its standard-input runs stop once their times add up past it (a response with many slow tests fails
            at this bound instead of holding the step).
        memory_mib: each program's address space, MiB.
        output_mib: the call program's kept output, MiB (past it: ``flood``). A standard-input run keeps
            ``max(64 KiB, 2 x the expected output + 4 KiB)``.
        require_confined_reads: refuse to start where the OS does not confine the programs' reads (Landlock): a
            program could otherwise read the data files that hold the expected outputs.
    """

    test_timeout_s: float = 4.0
    total_timeout_s: float = 30.0
    memory_mib: int = 1024
    output_mib: int = 4
    require_confined_reads: bool = True


def _program(main: str, *args: Any) -> str:
    """The child source with one call of `main` on literal arguments (repr: text, numbers, lists, dicts)."""
    return f"{_CHILD}\n{main}({', '.join(repr(a) for a in args)})\n"


def _lines(stdout: str, nonce: str) -> tuple[list[dict], bool]:
    """The harness's lines of a program's stdout, and whether any line carried the nonce without being one (a
    forgery: the harness writes whole JSON objects)."""
    out, bad = [], False
    for line in stdout.split("\n"):
        if not line.startswith(nonce):
            continue
        try:
            obj = json.loads(line[len(nonce) :])
        except (json.JSONDecodeError, RecursionError):
            bad = True
            continue
        if isinstance(obj, dict):
            out.append(obj)
        else:
            bad = True
    return out, bad


@dataclass
class _Verdict:
    """One response's verdict, built up over its programs."""

    outcome: str = ""
    passed: int = 0
    total: int = 0
    hacks: tuple[str, ...] = ()
    detail: str = ""

    def hack(self, kind: str) -> None:
        if kind not in self.hacks:
            self.hacks = (*self.hacks, kind)


STDIO_WAVE = 4
"""Standard-input tests a response runs per round; with DAPO's ±1 a response stops at its first failing test."""

_COMPILE_ERRORS = ("raised SyntaxError", "raised IndentationError", "raised TabError")


def _stdio_cap(expected: str) -> int:
    return max(64 << 10, 2 * len(expected.encode("utf-8", "surrogatepass")) + (4 << 10))


class _Malformed(Exception):
    """A report line the harness would not have written."""


def _str_list(x: Any) -> list[str]:
    if not isinstance(x, list) or not all(isinstance(y, str) for y in x):
        raise _Malformed("tampered is not a list of names")
    return x


class CodeScorer:
    """Scores code responses against hidden tests in the program sandbox (see the module docstring).

    Two sandboxes: `runner` runs the model's programs; a second one, started on the first HumanEval row, runs the
    check's record and replay programs, so that no template that forks model code ever held a test (a template's
    freed memory is inherited by the children it forks).

    Args:
        num_workers: sandbox templates (programs run side by side), >= 1.
        limits: `CodeLimits`.
        pass_rate: score the share of tests passed (``2 * passed / total - 1``) instead of DAPO's ±1.

    Use as a context manager or call `close()`.

    Raises:
        RuntimeError: the sandbox did not start, or it cannot confine the programs' reads and
            `limits.require_confined_reads` is set.
    """

    def __init__(self, num_workers: int = 1, limits: CodeLimits = CodeLimits(), *, pass_rate: bool = False):
        from dapo_rl.sandbox import ProgramLimits, ProgramRunner

        self.limits, self.pass_rate = limits, pass_rate
        self._base = ProgramLimits(
            wall_s=limits.test_timeout_s,
            cpu_s=limits.test_timeout_s,
            memory_bytes=int(limits.memory_mib) << 20,
            output_bytes=int(limits.output_mib) << 20,
        )
        self._workers = max(1, int(num_workers))
        self.runner = ProgramRunner(self._workers, self._base)
        if limits.require_confined_reads and not self.runner.layers.get("reads"):
            missing = "; ".join(self.runner.missing) or "reads"
            self.runner.close()
            raise RuntimeError(
                "the code reward needs the sandbox to confine what programs read (Landlock), or a program could "
                f"read the expected outputs from the data files; missing: {missing}. Set "
                "reward.code.require_confined_reads=false to run without it."
            )
        self._checker = None
        self._records: dict[str, list | str] = {}

    def __enter__(self) -> CodeScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sandboxes; idempotent."""
        self.runner.close()
        if self._checker is not None:
            self._checker.close()

    def _checker_runner(self):
        """The sandbox of the HumanEval checks (record and replay): never the model's."""
        if self._checker is None:
            from dapo_rl.sandbox import ProgramRunner

            self._checker = ProgramRunner(self._workers, self._base)
        return self._checker

    def _limits(self, wall_s: float, output_bytes: int | None = None):
        from dataclasses import replace

        out = replace(self._base, wall_s=wall_s, cpu_s=wall_s)
        return out if output_bytes is None else replace(out, output_bytes=output_bytes)

    def score(self, items: Sequence[tuple[str, Any]]) -> list[ScoreResult]:
        """Score each `(response text, ground truth)`; results in order. Never raises on model output.

        Returns:
            Per item ``{"score", "acc", "pred": "<passed>/<total>", "code": {"outcome", "passed", "total",
            "hacks"}}``; a row whose tests cannot be read gets an ``error`` result instead.

        Raises:
            RuntimeError: the runner is closed.
        """
        results: list[ScoreResult | None] = [None] * len(items)
        jobs: list[tuple[int, str, TestSuite]] = []
        for i, (text, gt) in enumerate(items):
            try:
                suite = parse_tests(gt)
            except ValueError as e:
                results[i] = error_result(ValueError(f"the row's tests: {e}"))
                continue
            code = last_code_block(str(text))
            if code is None:
                results[i] = self._result(_Verdict("no_code", 0, len(suite)))
                continue
            jobs.append((i, code, suite))
        transient = self._record([s for _, _, s in jobs if isinstance(s, CheckTests)])
        calls_of: dict[
            int, tuple[str, list, str, str]
        ] = {}  # item -> (nonce, calls, function, program's code)
        for i, code, suite in jobs:
            if isinstance(suite, CheckTests):
                key = _record_key(suite)
                if key in transient:  # the sandbox failed under the record: not the policy's doing
                    results[i] = self._result(_Verdict("sandbox_error", 0, 1, detail=transient[key]))
                    continue
                calls = self._records[key]
                if isinstance(calls, str):  # the check could not be recorded: the data's fault
                    results[i] = error_result(ValueError(f"the row's HumanEval check: {calls}"))
                    continue
                calls_of[i] = (
                    secrets.token_hex(8),
                    list(calls),
                    suite.entry_point,
                    suite.prompt + "\n" + code,
                )
            elif isinstance(suite, CallTests):
                calls_of[i] = (secrets.token_hex(8), list(suite.calls), suite.fn_name, code)
        stdio = {i: _StdioState(code, suite) for i, code, suite in jobs if isinstance(suite, StdioTests)}
        # the first round: every call program and every standard-input response's first wave, side by side
        programs, stdin, limits, owners = [], [], [], []
        for i, (nonce, calls, fn, code) in calls_of.items():
            programs.append(self._call_program(nonce, code, calls, fn))
            stdin.append("")
            limits.append(self._limits(self._call_wall(len(calls))))
            owners.append((i, -1))
        called: dict[int, Any] = {}
        while True:
            for i, st in stdio.items():
                for t in st.wave(self.pass_rate):
                    programs.append(st.code)
                    stdin.append(st.suite.inputs[t])
                    limits.append(self._limits(self.limits.test_timeout_s, _stdio_cap(st.suite.outputs[t])))
                    owners.append((i, t))
            if not programs:
                break
            for (i, t), res in zip(owners, self.runner.run(programs, stdin, limits)):
                if t < 0:
                    called[i] = res
                else:
                    stdio[i].take(t, res, self.limits.total_timeout_s)
            programs, stdin, limits, owners = [], [], [], []
        for i, st in stdio.items():
            results[i] = self._result(st.verdict())
        replays = []
        for i, _, suite in jobs:
            if results[i] is not None or i not in calls_of:
                continue
            nonce, calls, _, program_code = calls_of[i]
            outputs = suite.outputs if isinstance(suite, CallTests) else None
            wrapped = isinstance(suite, CallTests) and suite.wrapped
            verdict, values = self._judge_calls(len(calls), outputs, called[i], nonce, wrapped)
            if isinstance(suite, CallTests) or verdict.outcome:
                results[i] = self._result(verdict)
                continue
            replays.append((i, suite, program_code, calls, _table(calls, values)))
        for i, verdict in self._replay(replays).items():
            results[i] = self._result(verdict)
        return results  # type: ignore[return-value]

    def _call_wall(self, n: int) -> float:
        return min(LOAD_S + n * self.limits.test_timeout_s, max(self.limits.total_timeout_s, LOAD_S + 1.0))

    def _call_program(self, nonce: str, code: str, calls: list, fn: str) -> str:
        # what the values may take of the output cap, leaving room for every other line of the report
        value_bytes = (int(self.limits.output_mib) << 20) - 65536 - 64 * len(calls)
        return _program(
            "call_main", nonce, code, calls, fn, float(self.limits.test_timeout_s), LOAD_S, value_bytes
        )

    def _result(self, v: _Verdict) -> ScoreResult:
        ok = v.outcome == "pass" and not v.hacks
        if self.pass_rate and v.total and not v.hacks and v.outcome not in ("sandbox_error", "no_code"):
            score = 2.0 * v.passed / v.total - 1.0
        else:
            score = CORRECT_SCORE if ok else WRONG_SCORE
        res: ScoreResult = {
            "score": score,
            "acc": ok,
            "pred": f"{v.passed}/{v.total}",
            "code": {"outcome": v.outcome, "passed": v.passed, "total": v.total, "hacks": list(v.hacks)},
        }
        if v.detail:
            res["code"]["detail"] = v.detail[:300]
        return res

    def _judge_calls(
        self, n: int, outputs: Sequence | None, res, nonce: str, wrapped: bool = False
    ) -> tuple[_Verdict, list]:
        """The verdict of a function-call program of `n` calls and the per-call entries (`{"value": data}` or the
        failure) in call order. With `outputs` (function tests) each value is compared; without (a HumanEval
        check, replayed next) the verdict's `outcome` stays empty unless a call timed out, the program ended early
        or a hack was seen. A report the harness would not have written is a ``forged_report``; nothing in it
        raises here."""
        total = n if outputs is not None else 1
        if res.status == "sandbox_error":
            return _Verdict("sandbox_error", 0, total, detail=res.detail), []
        try:
            return self._read_calls(n, outputs, res, nonce, wrapped)
        except (_Malformed, ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
            v = _Verdict("runtime_error", 0, total, detail=f"a report the harness did not write ({e})"[:300])
            v.hack("forged_report")
            return v, []

    def _read_calls(self, n: int, outputs, res, nonce: str, wrapped: bool) -> tuple[_Verdict, list]:
        v = _Verdict(total=n if outputs is not None else 1)
        lines, forged = _lines(res.stdout, nonce)
        if forged:
            v.hack("forged_report")
        if res.truncated:
            v.hack("flood")
        entries: list[dict] = []
        first = ""
        done = False
        for obj in lines:
            if done:
                raise _Malformed("a line after the last")
            if "tampered" in obj:
                v.hack("tampered")
                v.detail = ", ".join(_str_list(obj["tampered"]))[:300]
                break
            if "compile_error" in obj:
                first, v.detail = first or "compile_error", str(obj["compile_error"])
                break
            if "load_error" in obj:
                first = first or ("timeout" if obj["load_error"] == "timeout" else "runtime_error")
                v.detail = str(obj["load_error"])
                break
            if "exit" in obj and "i" not in obj:
                v.hack("exit")
                break
            if obj.get("done") is True:
                if len(entries) != n:
                    raise _Malformed(f"done after {len(entries)} of {n} calls")
                done = True
                continue
            i = obj.get("i")
            if type(i) is not int or i != len(entries) or i >= n:
                raise _Malformed(f"call index {i!r} where {len(entries)} was next")
            entry, kind = self._entry(obj, v)
            entries.append(entry)
            if kind == "value" and outputs is not None:
                good = call_equal(entry["value_decoded"], outputs[i], wrapped=wrapped)
                kind = "pass" if good else "wrong"
            if kind == "pass":
                v.passed += 1
            elif kind not in ("value", "pass") and not first and (outputs is not None or kind == "timeout"):
                first = kind  # a HumanEval check's replay decides the rest (it may expect an exception)
        if (
            done and res.status != "ok"
        ):  # a report of every call, then the program did not end as the harness does
            done = False
        if not done and not v.hacks and not first:
            # the program ended before its last line: killed at the wall time, by the CPU limit or memory, or it
            # left through os._exit (no report: the template says so)
            if res.status == "timeout" or (res.status == "killed" and "XCPU" in res.detail):
                first = "timeout"
            elif res.status == "error" and res.detail.startswith("exited without a report"):
                v.hack("exit")
            else:
                first = "runtime_error"
            v.detail = v.detail or res.detail
        if v.hacks and not first:
            first = "runtime_error"
        if outputs is not None:
            v.outcome = first or ("pass" if v.passed == n else "wrong")
        else:
            v.outcome = first  # a HumanEval check: replayed next when nothing failed yet
        return v, entries

    @staticmethod
    def _entry(obj: dict, v: _Verdict) -> tuple[dict, str]:
        """A call's line as a replay-table entry and its kind: ``value``, ``timeout``, ``runtime_error``,
        ``wrong``."""
        if "value" in obj:
            try:
                return {"value": obj["value"], "value_decoded": decode(obj["value"])}, "value"
            except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
                raise _Malformed("a value the harness would not have encoded") from e
        if obj.get("timeout") is True:
            return {"failed": "timeout"}, "timeout"
        if obj.get("exit") is True:
            v.hack("exit")
            return {"failed": "exit"}, "runtime_error"
        if type(obj.get("too_large")) is int:
            v.detail = (
                v.detail or f"returned a value of {obj['too_large']} bytes of JSON, past the output cap"
            )
            return {"failed": "too_large"}, "wrong"
        if "foreign" in obj:
            if obj.get("suspicious") is True:
                v.hack("always_equal")
            v.detail = v.detail or f"returned a {str(obj['foreign'])[:100]}, not plain data"
            return {"failed": "foreign"}, "wrong"
        if isinstance(obj.get("raised"), str):
            return {"raised": obj["raised"][:100]}, "runtime_error"
        raise _Malformed("a call line of no known kind")

    def _record(self, suites: list[CheckTests]) -> dict[str, str]:
        """Record the calls of each HumanEval check not yet recorded (`record_main`, in the checks' sandbox), or why
        it could not be (the data's fault, kept). Returns the checks the sandbox failed under (key -> why; not kept:
        recorded again next time)."""
        while len(self._records) > MAX_RECORDS:
            self._records.pop(next(iter(self._records)))
        todo = {}
        for s in suites:
            key = _record_key(s)
            if key in self._records:
                self._records[key] = self._records.pop(key)  # most recently used last
            else:
                todo[key] = s
        if not todo:
            return {}
        nonce = secrets.token_hex(8)
        programs = [_program("record_main", nonce, s.prompt, s.test, s.entry_point) for s in todo.values()]
        wall = self._limits(max(30.0, self.limits.total_timeout_s))
        transient = {}
        for key, res in zip(todo, self._checker_runner().run(programs, None, wall)):
            lines, _ = _lines(res.stdout, nonce)
            obj = lines[-1] if lines else {}
            if isinstance(obj.get("calls"), list):
                self._records[key] = obj["calls"]
            elif isinstance(obj.get("error"), str):
                self._records[key] = obj["error"]
            else:
                transient[key] = f"recording the check: {res.status}: {res.detail or res.stderr[-300:]}"
        return transient

    def _replay(self, replays: list) -> dict[int, _Verdict]:
        """Replay each HumanEval check against its function's values (in the checks' sandbox); calls the check made
        that were not recorded are run (in the model's sandbox) and the check replayed again, up to
        `REPLAY_ROUNDS` times."""
        verdicts: dict[int, _Verdict] = {}
        for _ in range(REPLAY_ROUNDS):
            if not replays:
                break
            nonce = secrets.token_hex(8)
            programs = [
                _program("replay_main", nonce, s.prompt, s.test, s.entry_point, table)
                for _, s, _, _, table in replays
            ]
            wall = self._limits(max(30.0, self.limits.total_timeout_s))
            again = []
            for (i, s, code, calls, table), res in zip(
                replays, self._checker_runner().run(programs, None, wall)
            ):
                lines, _ = _lines(res.stdout, nonce)
                obj = lines[-1] if lines else {}
                if res.status == "sandbox_error":
                    verdicts[i] = _Verdict("sandbox_error", 0, 1, detail=res.detail)
                elif obj.get("passed") is True:
                    verdicts[i] = _Verdict("pass", 1, 1)
                elif isinstance(obj.get("missing"), list) and obj["missing"]:
                    again.append((i, s, code, calls + obj["missing"], table))
                else:
                    why = str(obj.get("why") or f"{res.status}: {res.detail}")
                    raised = any("raised" in e for e in table.values())
                    outcome = "timeout" if res.status == "timeout" else "runtime_error" if raised else "wrong"
                    verdicts[i] = _Verdict(outcome, 0, 1, detail=why)
            replays = []
            if again:  # run the function on the calls the check made that were not recorded
                nonces = [secrets.token_hex(8) for _ in again]
                programs = [
                    self._call_program(nc, code, calls, s.entry_point)
                    for nc, (_, s, code, calls, _) in zip(nonces, again)
                ]
                limits = [self._limits(self._call_wall(len(c))) for _, _, _, c, _ in again]
                outs = self.runner.run(programs, None, limits)
                for nc, (i, s, code, calls, _), res in zip(nonces, again, outs):
                    verdict, values = self._judge_calls(len(calls), None, res, nc)
                    if verdict.outcome or verdict.hacks:
                        verdicts[i] = verdict
                    else:
                        replays.append((i, s, code, calls, _table(calls, values)))
        for i, *_ in replays:
            verdicts[i] = _Verdict("wrong", 0, 1, detail="the check kept calling with arguments not recorded")
        return verdicts


class _StdioState:
    """One standard-input response's tests so far: which ran, how they went, how long they took."""

    def __init__(self, code: str, suite: StdioTests):
        self.code, self.suite = code, suite
        self.next = 0
        self.v = _Verdict(total=len(suite))
        self.first = ""
        self.spent_s = 0.0
        self.stopped = False

    def wave(self, pass_rate: bool) -> range:
        """The tests to run next (none once stopped: all ran, a failure under ±1, or the time budget spent)."""
        if self.stopped or self.next >= len(self.suite):
            return range(0)
        out = range(self.next, min(self.next + STDIO_WAVE, len(self.suite)))
        self.next = out.stop
        self.pass_rate = pass_rate
        return out

    def take(self, t: int, res, total_s: float) -> None:
        """Judge test `t`'s run."""
        if self.v.outcome == "sandbox_error":
            return
        if res.status == "sandbox_error":
            self.v = _Verdict("sandbox_error", 0, len(self.suite), detail=res.detail)
            self.stopped = True
            return
        cap = _stdio_cap(self.suite.outputs[t])
        flooded = res.truncated and len(res.stdout.encode("utf-8", "surrogatepass")) >= cap - 4
        if flooded:
            self.v.hack("flood")
            kind = "wrong"
        elif res.status in ("timeout", "killed"):
            kind = "timeout" if res.status == "timeout" or "XCPU" in res.detail else "runtime_error"
        elif res.status == "error":
            kind = "compile_error" if res.detail in _COMPILE_ERRORS else "runtime_error"
        else:
            kind = "pass" if stdio_equal(res.stdout, self.suite.outputs[t]) else "wrong"
        self.spent_s += res.wall_s
        if kind == "pass":
            self.v.passed += 1
        elif not self.first:
            self.first, self.v.detail = kind, res.detail
        if (kind != "pass" and not getattr(self, "pass_rate", False)) or kind == "compile_error":
            self.stopped = True  # under ±1 the first failure decides; a compile error fails every test
        elif self.spent_s > total_s and self.next < len(self.suite):
            self.stopped = True
            self.first = self.first or "timeout"
            self.v.detail = (
                self.v.detail or f"the tests' times passed reward.code.total_timeout_s={total_s:g}"
            )

    def verdict(self) -> _Verdict:
        if self.v.outcome != "sandbox_error":
            self.v.outcome = self.first or ("pass" if self.v.passed == len(self.suite) else "wrong")
        return self.v


def _record_key(s: CheckTests) -> str:
    return hashlib.sha256(json.dumps([s.prompt, s.test, s.entry_point]).encode()).hexdigest()


def _table(calls: list, entries: list[dict]) -> dict[str, dict]:
    """The replay table: each recorded call's `key_of` text -> its entry (`{"value": data}` or a failure); calls
    the program never reached are absent (the replay then reports them missing... and a failure stays one)."""
    table = {}
    for call, entry in zip(calls, entries):
        args, kwargs = decode(call[0]), decode(call[1])
        table[key_of(args, kwargs)] = {k: v for k, v in entry.items() if k != "value_decoded"}
    return table


def score_code(
    items: Sequence[tuple[str, Any]], scorer: CodeScorer | None = None, **kwargs
) -> list[ScoreResult]:
    """Score `(response, ground truth)` pairs with `scorer`, or with a `CodeScorer(**kwargs)` made for the call."""
    if scorer is not None:
        return scorer.score(items)
    with CodeScorer(**kwargs) as s:
        return s.score(items)


def code_summary(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The `reward/code_*` rates of a batch's code results (over the responses scored by the code reward): each
    outcome but ``pass``/``wrong``, and ``reward/code_hack_rate`` (responses with a recognised hack attempt)."""
    code = [r["code"] for r in results if isinstance(r.get("code"), Mapping)]
    if not code:
        return {}
    n = len(code)
    out = {
        f"reward/code_{o}_rate": sum(c.get("outcome") == o for c in code) / n
        for o in ("compile_error", "runtime_error", "timeout", "sandbox_error", "no_code")
    }
    out["reward/code_hack_rate"] = sum(bool(c.get("hacks")) for c in code) / n
    out["reward/code_pass_rate"] = sum(c.get("passed", 0) for c in code) / max(
        sum(c.get("total", 0) for c in code), 1
    )
    return out
