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


SPARK_MODULES = {f"spark_queue.{name}" for name in ("datasource", "sink", "source", "session")}


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
