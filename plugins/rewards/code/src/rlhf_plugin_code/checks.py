"""The label's tests as steps, and the trusted side of the value comparison.

Each top-level statement of the label is a step run in the program's namespace. ``assert EXPR == LITERAL`` (either
side a literal) becomes a *value* step: only ``EXPR`` goes into the sandbox, its value comes back as a repr, and
the comparison with the literal happens here. The program never sees the expected value, so it cannot forge the
pass, whatever it does to the harness in its own process. Every other statement is an *exec* step whose success
the sandboxed harness reports; a program that hijacks that harness could forge it (docs/rewards.md, Code).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

# A correct answer's repr is about as long as the expected literal's; anything far longer is refused unparsed.
SLACK_CHARS = 1024


@dataclass(frozen=True)
class Step:
    kind: str  # "value" or "exec"
    source: str
    expected: Any = None

    def job(self) -> dict:
        return {"kind": self.kind, "source": self.source}

    def passed(self, record: dict) -> bool:
        if self.kind == "exec":
            return record.get("ok") is True
        text = record.get("value")
        if not isinstance(text, str) or len(text) > 4 * len(repr(self.expected)) + SLACK_CHARS:
            return False
        try:
            return bool(ast.literal_eval(text) == self.expected)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def steps(tests: str) -> list[Step]:
    """Raises SyntaxError for a label that is not Python."""
    out = []
    for statement in ast.parse(tests).body:
        test = statement.test if isinstance(statement, ast.Assert) else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            sides = [test.left, test.comparators[0]]
            for expr, other in (sides, sides[::-1]):
                is_literal, expected = _literal(other)
                if is_literal:
                    out.append(Step("value", ast.unparse(expr), expected))
                    break
            else:
                out.append(Step("exec", ast.unparse(statement)))
        else:
            out.append(Step("exec", ast.unparse(statement)))
    return out
