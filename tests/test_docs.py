"""The README and docs/ stay navigable: every command is in the README's index, every relative link
resolves (file and #anchor), and the README stays the user's page."""

import argparse
import re
from pathlib import Path

from tuner.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "search_spaces" / "README.md"]


def subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    heads = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_the_readme_indexes_every_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    commands = subcommands()
    assert len(commands) >= 10
    missing = [c for c in commands if f"`tuner {c}" not in index]
    assert missing == []


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.is_file() and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_a_page_and_docs_has_a_contents_list():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 300
    contents = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {Path(t.partition("#")[0]).name for t in links(ROOT / "docs" / "README.md")}
    unlisted = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and p.name not in listed]
    assert contents and unlisted == []


def test_the_readme_keeps_the_ci_test_command():
    """.ci/run runs the README's test command; the two must not drift apart."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.findall(r"python -m pytest[^\n`]*", readme)
    assert command, "the README names no test command"
    assert f"\n{command[-1].strip()}\n" in ci, (command[-1], "not a line of .ci/run")
    assert "pip install --no-deps rapidocr-onnxruntime==1.4.4" in readme and "rapidocr-onnxruntime==1.4.4" in ci
