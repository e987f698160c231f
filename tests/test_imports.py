"""The import contract of the package, checked on its import graph (grimp):

(a) only `slmclassify.cli` imports click, and nothing outside it imports `slmclassify.cli`
    (imports inside functions count too: a lazy import is still a dependency);
(b) no import cycle among slmclassify modules (each module its own strongly connected component;
    lazy imports inside functions count: a cycle broken only by laziness is still a cycle);
(c) the layers, top to bottom: cli > bench > jobs > serve | ray | label > wire > head > classifier >
    models > core > backends | io | web > errors | cache | interrupts | timing. A package only imports
    packages below it (lazily inside a function too); siblings of a layer do not import each other.

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
    ("wire",),
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
    assert not illegal, "imports against the layers (cli > bench > jobs > serve|ray|label > wire > head > classifier " \
                        "> models > core > backends|io > errors|cache|interrupts|timing):\n" + "\n".join(report)


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


# (d) `slmclassify.core` reads and writes no file: `io` reads task files, saved defaults, tables and
# labelled items into plain data and writes plots; `jobs.sources` builds core's objects from them.

CORE = f"{PACKAGE}.core"
FILE_MODULES = ("tomllib", "tomli", "tomlkit", "platformdirs", "matplotlib", "shutil", "tempfile", "glob", "gzip",
                "zipfile", "pickle", "h5py", "fastparquet", "pyarrow.parquet", "pyarrow.csv", "pyarrow.json",
                "pyarrow.feather", "pyarrow.dataset")
"""Modules whose job is files, paths on disk or plots (pyarrow and pandas themselves are allowed:
core builds in-memory tables and Arrow schemas with them)."""
FILE_CALLS = ("open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "savefig",
              "read_csv", "read_parquet", "read_json", "read_table", "read_excel", "read_feather", "to_csv",
              "to_parquet", "to_json", "to_feather")
"""Calls that read or write a file: builtin or os `open`, Path's readers and writers, pandas' readers
and writers, matplotlib's `savefig`."""
FILE_LOADERS = {"np": ("load", "save", "loadtxt", "savetxt", "fromfile"), "numpy": ("load", "save", "loadtxt", "savetxt",
                "fromfile"), "torch": ("load", "save"), "json": ("load", "dump")}
"""`module.function` calls that read or write a file (`json.loads`, from a string, is fine)."""


def _core_sources():
    import ast
    import importlib.util
    from pathlib import Path

    folder = Path(importlib.util.find_spec(CORE).origin).parent
    for path in sorted(folder.rglob("*.py")):
        yield path.relative_to(folder.parent.parent), ast.parse(path.read_text(encoding="utf-8"))


def _imported_names(tree) -> list[tuple[int, str]]:
    import ast

    out = []
    for node in ast.walk(tree):  # imports inside functions too
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _file_calls(tree) -> list[tuple[int, str]]:
    import ast

    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in FILE_CALLS:
            out.append((node.lineno, f"{func.id}("))
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if func.attr in FILE_CALLS or func.attr in FILE_LOADERS.get(owner, ()):
                out.append((node.lineno, f"{owner or '...'}.{func.attr}("))
    return out


def test_core_imports_no_io_module():
    g = graph()
    offenders = []
    for importer in sorted(m for m in g.modules if m == CORE or m.startswith(CORE + ".")):
        for imported in sorted(g.find_modules_directly_imported_by(importer)):
            if imported == f"{PACKAGE}.io" or imported.startswith(f"{PACKAGE}.io."):
                offenders += _lines(importer, imported)
    assert not offenders, "slmclassify.core imports slmclassify.io (core reads no file):\n" + "\n".join(offenders)


def test_core_imports_no_file_or_plot_module():
    offenders = [f"{path}:{line}: imports {name}" for path, tree in _core_sources()
                 for line, name in _imported_names(tree)
                 if any(name == m or name.startswith(m + ".") for m in FILE_MODULES)]
    assert not offenders, "slmclassify.core imports a file or plot module (move that part to io/):\n" + \
        "\n".join(offenders)


def test_core_calls_nothing_that_reads_or_writes_a_file():
    offenders = [f"{path}:{line}: {call}" for path, tree in _core_sources() for line, call in _file_calls(tree)]
    assert not offenders, "slmclassify.core reads or writes a file (move that part to io/):\n" + "\n".join(offenders)


def test_the_file_scan_finds_file_access():
    """The two scans above can fail: each kind of access is found, and a string or `json.loads` is not."""
    import ast

    tree = ast.parse("import tomllib\nfrom matplotlib import pyplot\nimport pyarrow as pa\nimport pyarrow.parquet\n"
                     "def f(p):\n    open(p)\n    p.read_text()\n    np.load(p)\n    json.loads('open(x)')\n"
                     "    fig.savefig(p)\n    '''p.write_text()'''\n")
    imported = [name for _, name in _imported_names(tree)
                if any(name == m or name.startswith(m + ".") for m in FILE_MODULES)]
    assert sorted(imported) == ["matplotlib", "matplotlib.pyplot", "pyarrow.parquet", "tomllib"]
    assert sorted(call for _, call in _file_calls(tree)) == ["fig.savefig(", "np.load(", "open(", "p.read_text("]
