"""The import contract of the package, checked on its import graph (grimp):

(a) only `slmclassify.cli` imports click, and nothing outside it imports `slmclassify.cli`
    (imports inside functions count too: a lazy import is still a dependency);
(b) no import cycle among slmclassify modules (each module its own strongly connected component;
    lazy imports inside functions count: a cycle broken only by laziness is still a cycle);
(c) the layers, top to bottom: cli > bench > jobs > serve | ray | label > head > classifier > models >
    core > backends | io | web > errors | cache | interrupts | timing. A package only imports packages
    below it (lazily inside a function too); siblings of a layer do not import each other.

Each failure prints the offending imports with file lines, or the chain of imports.
"""

from __future__ import annotations

from functools import cache

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = "slmclassify"
LAYERS = (
    ("cli",),
    ("bench",),
    ("jobs",),
    ("serve", "ray", "label"),
    ("head",),
    ("classifier",),
    ("models",),
    ("core",),
    ("backends", "io", "web"),
    ("errors", "cache", "interrupts", "timing"),
)
"""Top to bottom. Siblings in one layer are independent of each other, except the bottom one's
small modules (the error types, the cache folder, interrupts, the timing harness), which may
import one another."""


@cache
def graph():
    return grimp.build_graph(PACKAGE, include_external_packages=True)


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _in_cli(module: str) -> bool:
    return module == f"{PACKAGE}.cli" or module.startswith(f"{PACKAGE}.cli.")


def _lines(importer: str, imported: str) -> list[str]:
    return [f"{d['importer']}:{d['line_number']}: {d['line_contents']}"
            for d in graph().get_import_details(importer=importer, imported=imported)]


def test_only_the_cli_imports_click_or_the_cli():
    g = graph()
    offenders = []
    for importer in sorted(g.find_modules_that_directly_import("click")):
        if _ours(importer) and not _in_cli(importer):
            offenders += _lines(importer, "click")
    for cli_module in sorted(m for m in g.modules if _in_cli(m)):
        for importer in sorted(g.find_modules_that_directly_import(cli_module)):
            if not _in_cli(importer):
                offenders += _lines(importer, cli_module)
    assert not offenders, "library code imports click or the CLI (only slmclassify.cli may):\n" + "\n".join(offenders)


def _module_graph() -> dict[str, set[str]]:
    """{importer: the slmclassify modules it imports}, lazy imports inside functions included."""
    g = graph()
    return {m: {x for x in g.find_modules_directly_imported_by(m) if _ours(x)} for m in g.modules if _ours(m)}


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, as sorted lists."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            out.append(sorted(component))

    nodes = sorted(set(edges) | {m for targets in edges.values() for m in targets})
    for node in nodes:
        if node not in index:
            visit(node)
    return out


def _cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first module, as the chain of imports."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(edges.get(node, ()) & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component


def test_no_import_cycle_among_modules():
    edges = _module_graph()
    cycles = [c for c in _strongly_connected(edges) if len(c) > 1]
    report = []
    for component in cycles:
        chain = _cycle_in(component, edges)
        report.append(" -> ".join(chain))
        for importer, imported in zip(chain, chain[1:]):
            report += ["    " + line for line in _lines(importer, imported)]
    assert not cycles, "import cycles among modules:\n" + "\n".join(report)


def test_the_cycle_finder_finds_cycles():
    """The check above can fail: a two-module and a three-module cycle, and no false ones."""
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    cycles = sorted(c for c in _strongly_connected(edges) if len(c) > 1)
    assert cycles == [["a", "b"], ["c", "d", "e"]]
    assert _cycle_in(["c", "d", "e"], edges) == ["c", "d", "e", "c"]


def test_every_top_level_module_is_in_a_layer():
    placed = {name for layer in LAYERS for name in layer}
    top = {m.split(".")[1] for m in graph().modules if _ours(m) and m != PACKAGE}
    assert top <= placed, f"modules in no layer of LAYERS: {sorted(top - placed)}"


def test_layers_only_import_downwards():
    layers = [grimp.Layer(*names, independent=(names != LAYERS[-1])) for names in LAYERS]
    illegal = graph().find_illegal_dependencies_for_layers(layers=layers, containers={PACKAGE})
    report = []
    for dependency in sorted(illegal, key=lambda d: (d.importer, d.imported)):
        report.append(f"{dependency.importer} -> {dependency.imported}:")
        for route in dependency.routes:
            for head in sorted(route.heads):
                chain = [head, *route.middle]
                for tail in sorted(route.tails):
                    full = chain + [tail]
                    report.append("    " + " -> ".join(full))
                    for importer, imported in zip(full, full[1:]):
                        report += ["        " + line for line in _lines(importer, imported)]
    assert not illegal, "imports against the layers (cli > bench > jobs > serve|ray|label > head > classifier > models " \
                        "> core > backends|io > errors|cache|interrupts|timing):\n" + "\n".join(report)


PREPARATION = f"{PACKAGE}.models.prepare"
DECISIONS = ("decide_auto", "_decide")
"""`models/precision.py`'s entry points that decide `--precision auto`."""


def test_only_the_preparation_stage_decides_a_precision():
    """One owner for `--precision auto`: only `models/prepare.py` imports the decision (`decide_auto`)
    and nothing calls it elsewhere (a source scan, for calls through the module object)."""
    from pathlib import Path

    g = graph()
    offenders = []
    precision = f"{PACKAGE}.models.precision"
    for importer in sorted(g.find_modules_that_directly_import(precision)):
        if importer != PREPARATION:
            offenders += [line for line in _lines(importer, precision) if any(d in line for d in DECISIONS)]
    root = Path(__import__(PACKAGE).__file__).parent
    for path in sorted(root.rglob("*.py")):
        module = ".".join((PACKAGE, *path.relative_to(root).with_suffix("").parts))
        if module in (PREPARATION, precision):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if any(f"{d}(" in line for d in DECISIONS):
                offenders.append(f"{module}:{number}: {line.strip()}")
    assert not offenders, ("`--precision auto` is decided by the preparation stage only (models/prepare.py "
                           "load_model); these decide it elsewhere:\n" + "\n".join(offenders))
