"""No function of the Python sources is over 80 lines, as in every other language of the
project (clippy's too_many_lines, eslint's max-lines-per-function, Go's funlen)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRS = ("python", "tests", "examples", "bench", "matrix")
MAX_LINES = 80


def long_functions() -> list[str]:
    found = []
    for d in DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            if "gen_out" in path.parts:
                continue  # generated code
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    end = node.end_lineno or node.lineno
                    lines = end - node.lineno + 1
                    if lines > MAX_LINES:
                        rel = path.relative_to(ROOT)
                        found.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_function_is_over_80_lines() -> None:
    assert long_functions() == []
