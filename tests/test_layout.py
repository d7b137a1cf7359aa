"""The package's shape: no import cycles between its modules, and a pure core (no Spark,
no Delta, no files)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spark_queue"
IO_MODULES = ("pyspark", "deltalake", "pyarrow.fs", "pyarrow.parquet", "os", "pathlib")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def package_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        wanted = imports_of(path)
        graph[name] = {
            m for m in modules if m != name and (m in wanted) and not name.startswith(m + ".")
        }
    return graph


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


def test_the_core_touches_no_spark_delta_or_files():
    for path in (PACKAGE / "core").glob("*.py"):
        imported = imports_of(path)
        outside = {m for m in imported if m.startswith("spark_queue.")} - {
            m for m in imported if m.startswith("spark_queue.core")
        }
        assert outside <= {"spark_queue.options"}, (path.name, outside)  # arguments only
        assert not [m for m in imported if m.startswith(IO_MODULES)], path.name


SPARK_MODULES = {
    f"spark_queue.{name}" for name in ("datasource", "sink", "source", "session", "connect")
}


def test_only_the_spark_shell_imports_pyspark():
    """``QueueTable`` and the CLI run where PySpark is not installed (``pip install
    spark-queue`` without the ``spark`` extra): only the modules where Spark meets the queue
    import it, and none of the others imports one of those."""
    graph = package_graph()
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in SPARK_MODULES:
            continue
        assert not [m for m in imports_of(path) if m.startswith("pyspark")], name
        assert not graph[name] & SPARK_MODULES, (name, graph[name] & SPARK_MODULES)


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
        if module_name(path) != "spark_queue.session":
            assert not jvm_handles_in([ast.parse(path.read_text())]), module_name(path)
    functions = {
        node.name: node
        for module in ("session.py", "connect.py")
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
