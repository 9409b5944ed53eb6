"""The GPU check's dry run (`benchmarks/gpu_check.sh --dry-run`): the same code as on the lent GPU, on this CPU at
tiny shapes over a 1-rank gloo group, so a broken check is found here and not in the GPU machine's few minutes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(sections: str) -> tuple[int, list[str]]:
    """`gpu_check.sh --dry-run --sections SECTIONS` as the GPU machine runs it; its exit code and `gpu_check:` lines."""
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--sections", sections],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("gpu_check:")]
    assert lines, r.stderr[-3000:]
    return r.returncode, lines


def results(lines: list[str]) -> dict[str, str]:
    """`name -> PASS | FAIL | SKIP`."""
    out = {}
    for line in lines:
        m = re.match(r"gpu_check: (PASS|FAIL|SKIP) (\S+):", line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def test_fsdp2_dcp_and_logprob_sections_pass_on_the_cpu():
    code, lines = dry_run("fsdp2,dcp,logprobs")
    print("\n".join(lines))
    got = results(lines)
    assert lines[0].startswith("gpu_check: not provable on one GPU: vLLM colocated")  # the limits come first
    assert not [k for k, v in got.items() if v == "FAIL"], lines
    want = [
        "preflight/import",
        "fsdp2/sharded",
        "fsdp2/compute-dtype",
        "fsdp2/grads",
        "fsdp2/adamw-state",
        "fsdp2/equals-one-process-bf16",
        "fsdp2/equals-one-process-fp32",
        "fsdp2/engine-weights",
        "fsdp2/engine-weights-bf16",
        "dcp/round-trip",
        "dcp/hf-export",
        "dcp/next-update",
        "logprobs/packed-fp32",
        "logprobs/shared-prefix-fp32",
        "logprobs/packed-bf16",
        "logprobs/shared-prefix-bf16",
        "logprobs/fp32-head",
        "lazy-imports",
    ]
    assert {k: got.get(k) for k in want} == dict.fromkeys(want, "PASS")
    assert code == 0
    assert re.match(r"gpu_check: 18 passed, 0 failed, 0 skipped in \d+ s", lines[-1]), lines[-1]


@pytest.mark.slow
def test_throughput_memory_and_trainer_sections_on_the_cpu():
    """The trainer end to end (3 steps, resume), the update timing, and the memory probes' code at tiny shapes (their
    CUDA figures are SKIP lines with the reason)."""
    code, lines = dry_run("throughput,memory,e2e")
    print("\n".join(lines))
    got = results(lines)
    assert not [k for k, v in got.items() if v == "FAIL"], lines
    for k in ("throughput/update", "e2e/fit", "e2e/groups", "e2e/learns", "e2e/weight-push"):
        assert got.get(k) == "PASS", k
    for k in ("e2e/sync-logprob-gap", "e2e/resume", "lazy-imports"):
        assert got.get(k) == "PASS", k
    assert got.get("memory/32b-2layers") == got.get("memory/1.5b-recipe") == "SKIP"
    assert any("CUDA memory statistics need a GPU" in line for line in lines)
    # the same shapes through `dapo plan --measure` (a subprocess), its measured table beside the GPU's figures
    assert any("dapo plan --measure for the same shapes" in line for line in lines)
    assert any("| measured per GPU" in line for line in lines)
    assert code == 0
