"""The house's edges read like its core (issue 58): trace events are read typed everywhere outside the trace package
(no dispatch on an event's kind by string, no rebuilding a round's commits), and the decoder has one constructor."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READERS = ("dex_core", "app", "visualize", "benchmarks")
KINDS = {"start", "round", "token", "end"}


def _sources(*roots: str):
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            if path.relative_to(ROOT).parts[:2] != ("dex_core", "trace"):
                yield path, ast.parse(path.read_text())


def _kind_literals(node: ast.AST) -> bool:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(i, ast.Constant) and i.value in KINDS for i in items)


def string_dispatch(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` reads an event's kind by string: ``x["event"]``, ``x.get("event")``, an operand that names an
    event or a kind compared with an event-kind literal, or a call of ``round_commits``."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "event":
            found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get":
            if n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "event":
                found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Call) and "round_commits" in {
            getattr(n.func, "id", None),
            getattr(n.func, "attr", None),
        }:
            found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Compare):
            operands = [n.left, *n.comparators]
            named = [
                o
                for o in operands
                if not _kind_literals(o) and any(w in ast.unparse(o).lower() for w in ("event", "kind"))
            ]
            if named and any(_kind_literals(o) for o in operands):
                found.append((n.lineno, ast.unparse(n)))
    return found


def test_the_rule_sees_every_string_dispatch_it_forbids():
    code = """
if event["event"] == "round": pass
kind = record.get("event")
if e.kind in ("start", "end"): pass
commits = round_commits(event)
if isinstance(event, RoundEvent) and node.kind == "position": pass
"""
    assert sorted(line for line, _ in string_dispatch(ast.parse(code))) == [2, 2, 3, 4, 5]  # not line 6


def test_no_reader_outside_the_trace_package_dispatches_on_an_events_kind_by_string():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path, tree in _sources(*READERS)
        for line, text in string_dispatch(tree)
    ]
    assert found == []


def test_the_decoder_has_one_constructor():
    made = [
        f"{path.relative_to(ROOT)}:{n.lineno}"
        for path, tree in _sources("dex_core")
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "__new__"
    ]
    assert made == []
