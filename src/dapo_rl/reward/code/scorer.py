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

_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CHILD = (Path(__file__).with_name("child.py")).read_text(encoding="utf-8")
MAX_RECORDS = 4096
"""HumanEval problems whose recorded calls are kept (least recently used dropped)."""
LOAD_S = 5.0
"""Seconds a function test's module may take to load (its top-level code), on top of the tests' time."""
REPLAY_ROUNDS = 3
"""Replays of a HumanEval check before calls it made that were not recorded fail the response."""


def last_code_block(text: str) -> str | None:
    """The last fenced code block of a response tagged ``python``, ``python3``, ``py`` or untagged; None when there
    is none (an unclosed fence, as at the length limit, is none).

    Args:
        text: the decoded response.
    """
    blocks = _BLOCK.findall(text or "")
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class CodeLimits:
    """What the code reward's programs may use (`reward.code`).

    Attributes:
        test_timeout_s: seconds per test (a standard-input run's wall and CPU time, a function call's time).
        total_timeout_s: seconds all of one response's function calls may take together (a response with many
            slow tests fails at this bound instead of holding the step).
        memory_mib: each program's address space, MiB.
        output_mib: each program's kept output, MiB (past it: ``flood``).
    """

    test_timeout_s: float = 4.0
    total_timeout_s: float = 30.0
    memory_mib: int = 1024
    output_mib: int = 4


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


class CodeScorer:
    """Scores code responses against hidden tests in the program sandbox (see the module docstring).

    Args:
        num_workers: sandbox templates (programs run side by side), >= 1.
        limits: `CodeLimits`.
        pass_rate: score the share of tests passed (``2 * passed / total - 1``) instead of DAPO's ±1.

    Use as a context manager or call `close()`.

    Raises:
        RuntimeError: the sandbox did not start.
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
        self.runner = ProgramRunner(max(1, int(num_workers)), self._base)
        self._records: dict[str, list] = {}

    def __enter__(self) -> CodeScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sandbox; idempotent."""
        self.runner.close()

    def _limits(self, wall_s: float):
        from dataclasses import replace

        return replace(self._base, wall_s=wall_s, cpu_s=wall_s)

    def score(self, items: Sequence[tuple[str, Any]]) -> list[ScoreResult]:
        """Score each `(response text, ground truth)`; results in order. Never raises on model output.

        Returns:
            Per item ``{"score", "acc", "pred": "<passed>/<total>", "code": {"outcome", "passed", "total",
            "hacks"}}``; a row whose tests cannot be read gets an ``error`` result instead.
        """
        results: list[ScoreResult | None] = [None] * len(items)
        jobs: list[tuple[int, str, TestSuite]] = []
        for i, (text, gt) in enumerate(items):
            code = last_code_block(str(text))
            try:
                suite = parse_tests(gt)
            except ValueError as e:
                results[i] = error_result(ValueError(f"the row's tests: {e}"))
                continue
            if code is None:
                results[i] = self._result(_Verdict("no_code", 0, len(suite)))
                continue
            jobs.append((i, code, suite))
        self._record([s for _, _, s in jobs if isinstance(s, CheckTests)])
        # one runner call for every first program: standard-input tests, function calls, HumanEval's calls
        programs, stdin, limits, owners = [], [], [], []
        nonces: dict[int, str] = {}
        for i, code, suite in jobs:
            if isinstance(suite, StdioTests):
                for t, text in enumerate(suite.inputs):
                    programs.append(code)
                    stdin.append(text)
                    limits.append(self._base)
                    owners.append((i, t))
                continue
            if isinstance(suite, CheckTests):
                calls = self._records.get(_record_key(suite))
                if isinstance(calls, str):  # the check could not be recorded: the data's fault
                    results[i] = error_result(ValueError(f"the row's HumanEval check: {calls}"))
                    continue
                code = suite.prompt + "\n" + code
                fn = suite.entry_point
            else:
                calls, fn = list(suite.calls), suite.fn_name
            nonces[i] = secrets.token_hex(8)
            programs.append(self._call_program(nonces[i], code, calls, fn))
            stdin.append("")
            limits.append(self._limits(self._call_wall(len(calls))))
            owners.append((i, -1))
        outs = self.runner.run(programs, stdin, limits) if programs else []
        by_item: dict[int, list] = {}
        for (i, t), res in zip(owners, outs):
            by_item.setdefault(i, []).append((t, res))
        replays: list[tuple[int, CheckTests, str, list, dict]] = []
        for i, code, suite in jobs:
            if results[i] is not None:
                continue
            got = by_item.get(i, [])
            if isinstance(suite, StdioTests):
                results[i] = self._result(self._judge_stdio(suite, got))
                continue
            if isinstance(suite, CallTests):
                verdict, values = self._judge_calls(len(suite), suite.outputs, got[0][1], nonces[i])
            else:
                n = len(self._records[_record_key(suite)])
                verdict, values = self._judge_calls(n, None, got[0][1], nonces[i])
            if isinstance(suite, CallTests) or verdict.outcome:
                results[i] = self._result(verdict)
                continue
            calls = self._records[_record_key(suite)]
            replays.append((i, suite, suite.prompt + "\n" + code, calls, _table(calls, values)))
        for i, verdict in self._replay(replays).items():
            results[i] = self._result(verdict)
        return results  # type: ignore[return-value]

    def _call_wall(self, n: int) -> float:
        return min(LOAD_S + n * self.limits.test_timeout_s, max(self.limits.total_timeout_s, LOAD_S + 1.0))

    def _call_program(self, nonce: str, code: str, calls: list, fn: str) -> str:
        return _program("call_main", nonce, code, calls, fn, float(self.limits.test_timeout_s), LOAD_S)

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

    def _judge_stdio(self, suite: StdioTests, got: list) -> _Verdict:
        v = _Verdict(total=len(suite))
        first = ""
        for t, res in sorted(got, key=lambda x: x[0]):
            if res.status == "sandbox_error":
                return _Verdict("sandbox_error", 0, len(suite), detail=res.detail)
            if res.truncated:
                v.hack("flood")
                kind = "runtime_error"
            elif res.status in ("timeout", "killed"):
                kind = "timeout" if res.status == "timeout" or "XCPU" in res.detail else "runtime_error"
            elif res.status == "error":
                kind = "compile_error" if res.detail == "raised SyntaxError" else "runtime_error"
            else:
                kind = "pass" if stdio_equal(res.stdout, suite.outputs[t]) else "wrong"
            if kind == "pass":
                v.passed += 1
            elif not first:
                first, v.detail = kind, res.detail
        v.outcome = first or "pass"
        return v

    def _judge_calls(self, n: int, outputs: Sequence | None, res, nonce: str) -> tuple[_Verdict, list]:
        """The verdict of a function-call program of `n` calls and the per-call entries (`{"value": data}` or the
        failure) in call order. With `outputs` (function tests) each value is compared; without (a HumanEval
        check, replayed next) the verdict's `outcome` stays empty unless a call timed out, the program ended early
        or a hack was seen."""
        v = _Verdict(total=n if outputs is not None else 1)
        if res.status == "sandbox_error":
            return _Verdict("sandbox_error", 0, v.total, detail=res.detail), []
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
                v.hack("forged_report")
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
            if "tampered" in obj:
                v.hack("tampered")
                v.detail = ", ".join(map(str, obj["tampered"]))[:300]
                break
            if obj.get("done") is True:
                done = len(entries) == n
                if not done:
                    v.hack("forged_report")
                continue
            if obj.get("i") != len(entries):
                v.hack("forged_report")
                break
            entry, kind = self._entry(obj, v)
            entries.append(entry)
            if kind == "value" and outputs is not None:
                kind = "pass" if call_equal(entry["value_decoded"], outputs[len(entries) - 1]) else "wrong"
            if kind == "pass":
                v.passed += 1
            elif kind not in ("value", "pass") and not first and (outputs is not None or kind == "timeout"):
                first = kind  # a HumanEval check's replay decides the rest (it may expect an exception)
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
        """A call's line as a replay-table entry and its kind: ``value``, ``timeout``, ``runtime_error``."""
        if "value" in obj:
            try:
                return {"value": obj["value"], "value_decoded": decode(obj["value"])}, "value"
            except (ValueError, TypeError, KeyError, IndexError, RecursionError):
                v.hack("forged_report")  # the harness encodes only what it can decode
                return {"failed": "malformed value"}, "runtime_error"
        if obj.get("timeout"):
            return {"failed": "timeout"}, "timeout"
        if obj.get("exit"):
            v.hack("exit")
            return {"failed": "exit"}, "runtime_error"
        if "foreign" in obj:
            if obj.get("suspicious"):
                v.hack("always_equal")
            v.detail = v.detail or f"returned a {str(obj['foreign'])[:100]}, not plain data"
            return {"failed": "foreign"}, "wrong"
        return {"raised": str(obj.get("raised", "?"))[:100]}, "runtime_error"

    def _record(self, suites: list[CheckTests]) -> None:
        """Record the calls of each HumanEval check not yet recorded (`record_main`), or why it could not be."""
        todo = {}
        for s in suites:
            key = _record_key(s)
            if key in self._records:
                self._records[key] = self._records.pop(key)  # most recently used last
            else:
                todo[key] = s
        if not todo:
            return
        nonce = secrets.token_hex(8)
        programs = [_program("record_main", nonce, s.prompt, s.test, s.entry_point) for s in todo.values()]
        wall = self._limits(max(30.0, self.limits.total_timeout_s))
        for key, res in zip(todo, self.runner.run(programs, None, wall)):
            lines, _ = _lines(res.stdout, nonce)
            obj = lines[-1] if lines else {}
            if isinstance(obj.get("calls"), list):
                self._records[key] = obj["calls"]
            else:
                self._records[key] = str(
                    obj.get("error") or f"{res.status}: {res.detail or res.stderr[-300:]}"
                )
        while len(self._records) > MAX_RECORDS:
            self._records.pop(next(iter(self._records)))

    def _replay(self, replays: list) -> dict[int, _Verdict]:
        """Replay each HumanEval check against its function's values; calls the check made that were not recorded
        are run and the check replayed again, up to `REPLAY_ROUNDS` times."""
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
            for (i, s, code, calls, table), res in zip(replays, self.runner.run(programs, None, wall)):
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
                for nc, (i, s, code, calls, _), res in zip(
                    nonces, again, self.runner.run(programs, None, limits)
                ):
                    verdict, values = self._judge_calls(len(calls), None, res, nc)
                    if verdict.outcome or verdict.hacks:
                        verdicts[i] = verdict
                    else:
                        replays.append((i, s, code, calls, _table(calls, values)))
        for i, *_ in replays:
            verdicts[i] = _Verdict("wrong", 0, 1, detail="the check kept calling with arguments not recorded")
        return verdicts


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
