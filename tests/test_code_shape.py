"""Every module in proxy/ stays readable: at most 400 lines, no function over 60, no
measurements (they go stale: docs/performance.md keeps them, the code keeps the reason), and
no history or comparisons in comments."""

import ast
import re
from pathlib import Path

PROXY = Path(__file__).resolve().parent.parent / "proxy"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PROXY.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(PROXY.parent))


def test_no_module_over_400_lines() -> None:
    offenders = []
    for path in _modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{_name(path)}: {lines} lines")
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_over_60_lines() -> None:
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    offenders.append(f"{_name(path)}:{node.lineno} {node.name}: {lines} lines")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


MEASUREMENT = re.compile(r"\d\s?(µs|us|ns)\b|\bbench(/|_[a-z]+|\.[a-z])")
"""A time in micro- or nanoseconds, or a pointer into bench/: a figure, or where one came from."""


def test_no_measurements_in_the_code() -> None:
    offenders = []
    for path in _modules():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if MEASUREMENT.search(line):
                offenders.append(f"{_name(path)}:{number}: {line.strip()}")
    assert not offenders, "figures belong in docs/performance.md:\n" + "\n".join(offenders)


COMPARISON = re.compile(
    r"\b(twice|thrice|\w+ times) (as )?(fast|slow|quick|cheap)"
    r"|\b(ten|hundred|\d+) ?(times|x) (faster|slower|cheaper|quicker)"
    r"|\b(far|much) (cheaper|faster|slower)\b"
    r"|\bit replaces\b|\bcost more than\b|\bthe sum it\b",
    re.IGNORECASE,
)
"""History and comparisons: they say what the code was or how it measured, not why it is so
(docs/performance.md and the commit log keep those)."""


def test_no_history_or_comparisons_in_comments() -> None:
    offenders = []
    for path in _modules():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                offenders.append(f"{_name(path)}:{number}: {line.strip()}")
    assert not offenders, "say why, not what it replaced or how much faster:\n" + "\n".join(
        offenders
    )
