"""``tuner --help`` and every subcommand's help are plain text: argparse prints them as they are, so
markdown or reST markup (backticks, ``**``, roles, links) would reach the terminal verbatim."""

import argparse
import re
import subprocess
import sys

from tuner.cli import build_parser

MARKUP = re.compile(r"`|\*\*|:(?:mod|func|class|meth|attr):|\]\(")


def help_texts(parser: argparse.ArgumentParser, path: str = "tuner"):
    """(where, text) for the description, epilog and every argument's and subcommand's help."""
    yield f"{path} description", parser.description
    yield f"{path} epilog", parser.epilog
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest} (listed)", choice.help
            for name, sub in action.choices.items():
                yield from help_texts(sub, f"{path} {name}")
        else:
            yield f"{path} {action.dest}", action.help


def test_every_help_text_is_plain():
    texts = [(where, text) for where, text in help_texts(build_parser()) if text]
    assert len(texts) > 100          # the walk reached the subcommands' arguments
    marked = [f"{where}: {text}" for where, text in texts if MARKUP.search(text)]
    assert marked == []


def test_top_level_help_runs_and_lists_commands():
    r = subprocess.run([sys.executable, "-m", "tuner", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "search" in r.stdout and "verify" in r.stdout
    assert not MARKUP.search(r.stdout)
