"""The package's shape: layers by role with imports only downward, a pure rules layer (no
Spark, no Delta, no files), and PySpark in the Spark layer only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spark_queue"
IO_MODULES = ("pyspark", "deltalake", "pyarrow.fs", "pyarrow.parquet", "os", "pathlib")

# The layers, lowest first. A module may import modules of its own layer and of the layers
# below it, never one above. A name stands for the module and everything under it; the
# longest name that matches a module places it.
LAYERS = (
    ("spark_queue.errors", "spark_queue.portable"),
    ("spark_queue.model",),
    ("spark_queue.rules",),
    ("spark_queue.storage",),
    ("spark_queue.commit",),
    ("spark_queue.broker",),  # the client side: wire, auth, sessions, discovery, client
    ("spark_queue.clients",),
    ("spark_queue.table", "spark_queue.partitioned"),
    ("spark_queue.server", "spark_queue.spark"),  # the broker's servers; the data source
    ("spark_queue.cli", "spark_queue"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions: ``from a import b``
    imports the module ``a.b`` where that is one, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return found


def layer_of(module: str) -> int:
    placed = [
        (len(name), index)
        for index, names in enumerate(LAYERS)
        for name in names
        if module == name or module.startswith(name + ".")
    ]
    assert placed, f"{module} is in no layer of LAYERS"
    return max(placed)[1]


def package_graph() -> dict[str, set[str]]:
    return {
        name: {m for m in imports_of(path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def test_every_module_imports_only_its_own_layer_and_those_below():
    upward = [
        f"{name} (layer {layer_of(name)}) imports {other} (layer {layer_of(other)})"
        for name, imported in sorted(package_graph().items())
        for other in sorted(imported)
        if layer_of(other) > layer_of(name)
    ]
    assert upward == []


def test_the_package_imports_nothing_of_the_repository_around_it():
    """The wheel holds ``spark_queue`` alone: a module importing the repository's tools
    (the docs generator), tests, jobs or benchmarks would fail where it is installed."""
    around = ("tools", "tests", "jobs", "benchmarks")
    found = {
        name: sorted(m for m in imports_of(path) if m.split(".")[0] in around)
        for name, path in MODULES.items()
    }
    assert {name: imported for name, imported in found.items() if imported} == {}


def test_the_layer_map_names_only_modules_that_exist():
    assert [n for names in LAYERS for n in names if n not in MODULES] == []


def test_no_module_imports_one_that_imports_it():
    graph = package_graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_rules_touch_no_spark_delta_or_files():
    for path in (PACKAGE / "rules").glob("*.py"):
        imported = imports_of(path)
        inside = ("spark_queue.rules", "spark_queue.model", "spark_queue.errors")
        outside = {m for m in imported if m.startswith("spark_queue")} - {
            m for m in imported if m.startswith(inside)
        }
        assert outside == set(), (path.name, outside)
        assert not [m for m in imported if m.startswith(IO_MODULES)], path.name


def test_the_wire_format_imports_only_the_model():
    """``broker.wire`` is pure functions over values: requests and results on the wire
    need the model's values and errors, never the commit engine or the store."""
    imported = {m for m in imports_of(PACKAGE / "broker" / "wire.py") if m in MODULES}
    below = ("spark_queue.model", "spark_queue.errors", "spark_queue.portable")
    assert {m for m in imported if not m.startswith(below)} == set()


def test_only_the_spark_layer_imports_pyspark():
    """``QueueTable``, the clients, the broker and the CLI run where PySpark is not
    installed (``pip install spark-queue`` without the ``spark`` extra)."""
    for name, path in MODULES.items():
        if not name.startswith("spark_queue.spark"):
            assert not [m for m in imports_of(path) if m.startswith("pyspark")], name


# What a Spark Connect session lacks: a classic session's JVM handles. Touching one there
# fails with JVM_ATTRIBUTE_NOT_SUPPORTED.
JVM_HANDLES = {"sparkContext", "_jvm", "_jsc", "_sc", "_jsparkSession", "_jconf"}
# session.py functions that branch on the kind of session: their Connect path is the first
# ``if`` on this name, with what comes before it (and after it, unless the branch returns).
CONNECT_BRANCHES = {"register": "is_connect", "local_session": "remote"}


def jvm_handles_in(nodes: list[ast.AST]) -> set[str]:
    found = set()
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and inner.attr in JVM_HANDLES:
                found.add(inner.attr)
            elif isinstance(inner, ast.Name) and inner.id in JVM_HANDLES:
                found.add(inner.id)
    return found


def connect_path(function: ast.FunctionDef, condition: str) -> list[ast.AST]:
    """The statements of ``function`` a Connect session runs (see CONNECT_BRANCHES)."""
    path: list[ast.AST] = []
    statements = iter(function.body)
    for statement in statements:
        tested = ast.walk(statement.test) if isinstance(statement, ast.If) else ()
        mentions = {n.id for n in tested if isinstance(n, ast.Name)}
        if condition not in mentions:
            path.append(statement)
            continue
        path += [statement.test, *statement.body]
        if not isinstance(statement.body[-1], ast.Return):
            path += list(statements)
        return path
    raise AssertionError(f"{function.name} has no branch on {condition}")


def test_no_code_a_connect_session_reaches_touches_the_jvm():
    """From ``register`` and ``local_session(remote=True)`` through every function they call
    in ``session`` and ``connect``, and every module the server's Python workers run (all but
    ``session``), nothing names ``sparkContext``, ``_jvm``, ``_jsc`` or their kin."""
    for path in PACKAGE.rglob("*.py"):
        if module_name(path) != "spark_queue.spark.session":
            assert not jvm_handles_in([ast.parse(path.read_text())]), module_name(path)
    functions = {
        node.name: node
        for module in ("spark/session.py", "spark/connect.py")
        for node in ast.parse((PACKAGE / module).read_text()).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }
    reached: dict[str, list[ast.AST]] = {}
    pending = list(CONNECT_BRANCHES)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        node = functions[name]
        condition = CONNECT_BRANCHES.get(name)
        reached[name] = connect_path(node, condition) if condition else [node]
        for inner in (n for statement in reached[name] for n in ast.walk(statement)):
            if isinstance(inner, ast.Name) and inner.id in functions:
                pending.append(inner.id)
    assert {"ship_package", "connect_session", "start_connect_server"} <= reached.keys()
    assert "_py_files_for_driver_workers" not in reached  # the classic path's
    touched = {name: jvm_handles_in(nodes) for name, nodes in reached.items()}
    assert {name: found for name, found in touched.items() if found} == {}


MAX_MODULE_LINES = 900  # past this a module holds more than one concern: split it by concern


def test_no_module_is_over_the_line_limit():
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"
