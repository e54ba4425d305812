"""Shell conventions: -V, and completion of verbs, options and run directories."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import gptcli, run


def test_short_version_flag():
    from gptcli import __version__

    assert run("-V").stdout.strip() == f"gptcli {__version__}"


def complete(words: str, cwd: Path) -> list[str]:
    """What bash completion offers for the last of words (as typed so far)."""
    env = {
        "_GPTCLI_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    result = gptcli([], cwd, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_completion_of_verbs_options_and_runs(tmp_path):
    for run_dir in ("runs/demo/best", "runs/demo/last", "runs/other/last"):
        (tmp_path / run_dir).mkdir(parents=True)
    assert complete("gptcli sa", tmp_path) == ["sample"]
    assert "--max-new-tokens" in complete("gptcli sample --max", tmp_path)
    assert complete("gptcli sample --ckpt runs/d", tmp_path) == [
        "runs/demo",
        "runs/demo/best",
        "runs/demo/last",
    ]
    assert complete("gptcli eval --ckpt runs/o", tmp_path) == ["runs/other", "runs/other/last"]


def test_the_completion_script_is_offered():
    assert "--install-completion" in run("--help").stdout
