"""The package's layout limits: no function over 80 lines, no module over 500 (an ast walk of tuner/)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tuner"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500
MODULES = sorted(PACKAGE.rglob("*.py"))
#: Still over a limit (issue 24 part 4, not split yet): strict xfails, so a split that fixes one fails
#: here until it is struck off the list, and a new offender fails at once.
LONG_FUNCTIONS_LEFT: set[str] = set()
LONG_MODULES_LEFT: set[str] = set()


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function or method in ``source`` longer than ``limit`` lines
    (nested ones too; decorators excluded, docstring included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                found.append((node.name, node.lineno, n))
    return found


def _id(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_the_walk_sees_the_package_and_methods_and_nested_functions():
    assert len(MODULES) > 50 and PACKAGE / "cli.py" in MODULES
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = f"class C:\n    def long(self):\n{body}\n    def short(self):\n        return 1\n"
    assert long_functions(source) == [("long", 2, MAX_FUNCTION_LINES + 1)]
    nested = "def outer():\n    def inner():\n" + body.replace("        ", "        " * 1) + "    return inner\n"
    assert [name for name, _, _ in long_functions(nested)] == ["outer", "inner"]


def _cases(left: set[str]) -> list:
    return [pytest.param(p, id=_id(p), marks=pytest.mark.xfail(strict=True, reason="not split yet"))
            if _id(p) in left else pytest.param(p, id=_id(p)) for p in MODULES]


@pytest.mark.parametrize("path", _cases(LONG_FUNCTIONS_LEFT))
def test_no_function_over_80_lines(path):
    assert long_functions(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", _cases(LONG_MODULES_LEFT))
def test_no_module_over_500_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_FILE_LINES
