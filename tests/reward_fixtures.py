"""User reward functions (verl's signature) for the reward-pool tests, loaded by `module:function` names."""


def hang(data_source, solution_str, ground_truth, extra_info=None):
    """A verifier that never returns unless the response says "fast"."""
    if "fast" in solution_str:
        return 1.0
    while True:
        pass


def exact(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response equals the ground truth, else -1 (a dict result with its own pred)."""
    ok = solution_str.strip() == str(ground_truth)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": solution_str.strip()}
