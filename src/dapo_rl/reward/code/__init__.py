"""The code reward: programs a model wrote, run against hidden tests in the sandbox and judged by the trainer's
process (`CodeScorer`; `reward.name: code`).

- `dapo_rl.reward.code.suites`: the tests of a row in the forms the field uses, and the comparisons;
- `dapo_rl.reward.code.child`: the programs that run in the sandbox (read as text, never imported there);
- `dapo_rl.reward.code.scorer`: extraction, the runs, the verdicts, the `reward/code_*` rates.
"""

from dapo_rl.reward.code.scorer import (
    CODE_OUTCOMES,
    HACKS,
    CodeLimits,
    CodeScorer,
    code_summary,
    last_code_block,
    score_code,
)
from dapo_rl.reward.code.suites import CallTests, CheckTests, StdioTests, call_equal, parse_tests, stdio_equal

__all__ = [
    "CODE_OUTCOMES",
    "HACKS",
    "CallTests",
    "CheckTests",
    "CodeLimits",
    "CodeScorer",
    "StdioTests",
    "call_equal",
    "code_summary",
    "last_code_block",
    "parse_tests",
    "score_code",
    "stdio_equal",
]
