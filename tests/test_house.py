"""The house rules that keep the code readable, checked on the source (issue "the house, third pass"):

- no function in `src/` longer than `MAX_FUNCTION_LINES` (its `def` to its last line, docstring and
  nested functions included): a longer one is split into named steps;
- `core/` knows nothing of the wire formats (no ids, timestamps or `object` fields: `wire/` owns them);
- the engine's forward stays one readable file (`MAX_FORWARD_LINES`), the README a front page
  (`MAX_README_LINES`: the rest is in docs/);
- `Classifier` keeps at most `MAX_CLASSIFIER_METHODS` public methods (one way to score);
- code does not ask which kind a task is (`KIND_BRANCHES`): the readouts (`core/readout.py`) answer
  for each kind. A ratchet: the count may only go down (the goal is 15, none in jobs/, label/, cli/
  or serve/).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "slmclassify"
MAX_FUNCTION_LINES = 80
MAX_FORWARD_LINES = 450
MAX_README_LINES = 300
WIRE_WORDS = ("uuid", "time.time", '"chat.completion"', '"object":')
KIND_TEST = re.compile(r"if .*(multi_label|\.questions|multilabel)")
KIND_BRANCHES = 8
"""Lines of `src/` that test a task's kind (`KIND_TEST`), at most: lower it as branches move to readouts."""


def long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function or method over `limit` lines."""
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_over_80_lines():
    offenders = [f"{path.relative_to(SRC)}:{line}: {name} is {length} lines"
                 for path in sorted(SRC.rglob("*.py")) for line, name, length in long_functions(ast.parse(path.read_text()))]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + \
        "\n".join(offenders)


def test_the_length_count_finds_a_long_function():
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def short():\n    return 1\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions(tree) == [(5, "long", MAX_FUNCTION_LINES + 1)]


def test_core_holds_no_wire_format():
    offenders = [f"{path.relative_to(SRC)}:{k}: {word}" for path in sorted((SRC / "core").rglob("*.py"))
                 for k, line in enumerate(path.read_text().splitlines(), start=1) for word in WIRE_WORDS if word in line]
    assert not offenders, "core/ holds a wire-format notion (it belongs in wire/):\n" + "\n".join(offenders)


def test_the_forward_is_one_readable_file():
    lines = len((SRC / "core" / "engine" / "forward.py").read_text().splitlines())
    assert lines <= MAX_FORWARD_LINES, f"core/engine/forward.py is {lines} lines (at most {MAX_FORWARD_LINES})"


def test_the_readme_is_a_front_page():
    lines = len((SRC.parents[1] / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md is {lines} lines (at most {MAX_README_LINES}: move the rest to docs/)"


def test_kind_branches_only_go_down():
    found = [f"{path.relative_to(SRC)}:{k}: {line.strip()}" for path in sorted(SRC.rglob("*")) if path.is_file()
             and path.suffix in (".py", ".html") for k, line in enumerate(path.read_text().splitlines(), start=1)
             if KIND_TEST.search(line)]
    assert len(found) <= KIND_BRANCHES, (f"{len(found)} lines ask which kind a task is (at most {KIND_BRANCHES}): "
                                         "ask its questions' readouts instead (core/readout.py)\n" + "\n".join(found))


MAX_CLASSIFIER_METHODS = 8


def test_the_classifier_keeps_a_small_surface():
    """Classify texts, an iterator, a table's windows; score items (the one scoring step), encode,
    score, the reference path, a variant: descriptions and calibration live beside it, not on it."""
    tree = ast.parse((SRC / "classifier.py").read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Classifier")
    public = [node.name for node in cls.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
              and not any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)]
    assert len(public) <= MAX_CLASSIFIER_METHODS, f"Classifier has {len(public)} public methods: {public}"
