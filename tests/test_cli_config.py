"""`dapo --version` and `dapo config`: every setting of a recipe with its value, default and one-line doc."""

from dataclasses import is_dataclass
from importlib.metadata import version

from e2e import dapo

from dapo_rl import config as config_module
from dapo_rl.cli import main
from dapo_rl.config import Config, load_config
from dapo_rl.config_help import config_rows, one_line


def _row(out: str, key: str) -> list[str]:
    """The cells of KEY's line in `dapo config` output: [mark?, key, value, default, doc...]."""
    for line in out.splitlines():
        cells = line.split()
        if key in cells[:2]:
            return cells
    raise AssertionError(f"{key} not in:\n{out}")


def test_version_prints_the_installed_version_and_exits_0():
    r = dapo("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"dapo {version('dapo-rl')}"


def test_config_of_a_shipped_recipe_shows_value_default_and_doc(capsys):
    assert main(["config", "tiny_chain_sum"]) == 0
    out = capsys.readouterr().out
    assert Config().algorithm.clip_ratio_high == 0.28
    cells = _row(out, "algorithm.clip_ratio_high")
    assert cells[:3] == ["algorithm.clip_ratio_high", "0.28", "0.28"]  # unchanged: no mark
    assert " ".join(cells[3:]) == "epsilon_high of Clip-Higher (Eq. 10)."
    # the recipe's own values are marked: tiny_chain_sum sets data.max_response_length: 24 (default 20480)
    assert _row(out, "data.max_response_length")[:4] == ["*", "data.max_response_length", "24", "20480"]
    # a dict value reads as the recipe writes it
    assert "{max_digits: 2, max_terms: 3, min_digits: 1, min_terms: 2}" in out
    # every leaf setting has a line (plus the header lines and the empty campo.stages' item settings)
    n_rows = len(config_rows(load_config("tiny_chain_sum")))
    assert len(out.splitlines()) == n_rows + 2


def test_no_recipe_is_the_embedded_default_and_an_override_shows_as_changed(capsys):
    assert main(["config", "algorithm.clip_ratio_high=0.3", "--grep", "CLIP_RATIO_HIGH"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("dapo config: tiny_chain_steps + 1 override(s): ")
    assert _row(out, "algorithm.clip_ratio_high")[:4] == ["*", "algorithm.clip_ratio_high", "0.3", "0.28"]


def test_grep_narrows_to_matching_keys_and_docs_and_may_stand_between_overrides(capsys):
    assert main(["config", "rollout.n=4", "--grep", r"epsilon_(low|high)", "actor.lr=1e-3"]) == 0
    out = capsys.readouterr().out
    keys = [line.lstrip("* ").split()[0] for line in out.splitlines()[2:]]
    # matched by their docs ("epsilon_high of Clip-Higher"), not their keys
    assert keys == [
        "algorithm.clip_ratio_low",
        "algorithm.clip_ratio_high",
        "algorithm.campo.stages[].clip_ratio_low",
        "algorithm.campo.stages[].clip_ratio_high",
    ]
    assert "2 override(s): 4 setting(s) matching" in out


def test_a_list_of_sections_lists_each_item(capsys):
    assert main(["config", "tiny_campo", "--grep", r"campo\.stages"]) == 0
    out = capsys.readouterr().out
    assert _row(out, "algorithm.campo.stages")[:4] == ["*", "algorithm.campo.stages", "[3", "items]"]
    assert _row(out, "algorithm.campo.stages[1].max_response_length")[:4] == [
        "*",
        "algorithm.campo.stages[1].max_response_length",
        "36",
        "0",
    ]
    assert _row(out, "algorithm.campo.stages[2].clip_ratio_high")[:3] == [
        "algorithm.campo.stages[2].clip_ratio_high",
        "null",
        "null",
    ]


def test_unknown_recipe_and_bad_pattern_are_one_line_errors(capsys):
    assert main(["config", "tiny_chain_sun"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dapo: error: no recipe named 'tiny_chain_sun' (did you mean tiny_chain_sum?)")
    assert main(["config", "--grep", "clip("]) == 2
    assert "--grep 'clip(' is not a valid regular expression" in capsys.readouterr().err
    assert main(["config", "algorithm.clip_ratio_hi=0.3"]) == 2
    assert "did you mean algorithm.clip_ratio_high" in capsys.readouterr().err


def test_one_line_takes_the_first_sentence():
    assert one_line("A. B.") == "A."
    assert one_line("Task parameters, e.g. `{a: 1}`. More.") == "Task parameters, e.g. `{a: 1}`."
    assert one_line("Steps (DAPO: 3. Not here) and\n   more. Next") == "Steps (DAPO: 3. Not here) and more."
    assert one_line("Ratio 0.5 of x") == "Ratio 0.5 of x"


def test_every_config_field_has_a_doc():
    """Every setting `dapo config` lists has a doc (its field's docstring, or for an `enable` switch or a list of
    sections its class's), and every config dataclass has a docstring (a section's doc): a new field comes with the
    string literal right under it."""
    missing = sorted(r.key for r in config_rows(Config()) if not r.doc)
    assert missing == [], f"config fields without a docstring in dapo_rl/config.py: {missing}"
    for name in dir(config_module):
        cls = getattr(config_module, name)
        if isinstance(cls, type) and is_dataclass(cls) and cls.__module__ == config_module.__name__:
            assert cls.__doc__ and not cls.__doc__.startswith(name + "("), name  # not the generated signature
