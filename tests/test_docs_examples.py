"""Every ```python block of README.md and docs/ runs, as written, or says why it cannot.

A page's blocks run in order in one namespace, as a reader runs them one after the other, in
a fresh temporary folder: a relative path such as ``lake/queues`` (in examples without Spark)
and a folder of ``tempfile.mkdtemp()`` (in examples with Spark, whose Python workers do not
run in the driver's directory) land there.
A page whose blocks use Spark gets the suite's session as ``spark`` (the examples name the
session ``spark``, as notebooks and the pyspark shell do); ``local_session()`` in a block
returns that same session. Streaming queries a page leaves running are stopped after it.

A block that cannot run here (a Databricks-only call, a cluster, real cloud credentials) is
marked by the HTML comment ``<!-- not run: REASON -->`` on the line before its fence; a mark
without a reason fails.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MARK = re.compile(r"<!--\s*not run(?P<colon>:)?(?P<reason>.*?)-->\s*\Z", re.DOTALL)
USES_SPARK = re.compile(r"\bspark\b|local_session\(")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    skip_reason: str | None  # None: runs; "": marked without a reason


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        reason = None if mark is None else mark["reason"].strip() if mark["colon"] else ""
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(str(page.relative_to(ROOT)), line, match[1], reason))
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
RUNNABLE = {}
for _block in ALL_BLOCKS:
    if _block.skip_reason is None:
        RUNNABLE.setdefault(_block.page, []).append(_block)


def page_params():
    for page, page_blocks in RUNNABLE.items():
        spark = any(USES_SPARK.search(block.code) for block in page_blocks)
        yield pytest.param(page, marks=[pytest.mark.spark] if spark else [], id=page)


def test_every_mark_says_why_the_block_does_not_run():
    unexplained = [f"{b.page}:{b.line}" for b in ALL_BLOCKS if b.skip_reason == ""]
    assert not unexplained, f"<!-- not run: REASON --> without a reason: {unexplained}"


def test_the_readme_has_examples_that_run():
    assert RUNNABLE.get("README.md"), "README.md has no python block that runs"


@pytest.mark.parametrize("page", list(page_params()))
def test_the_examples_of_a_page_run(page, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for variable in ("SPARK_QUEUE_POLICIES", "SPARK_QUEUE_BROKER", "SPARK_QUEUE_BROKER_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    namespace: dict = {"__name__": "__docs__"}
    spark = None
    if request.node.get_closest_marker("spark"):
        spark = request.getfixturevalue("spark")
        namespace["spark"] = spark
    try:
        for block in RUNNABLE[page]:
            try:
                exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)
            except Exception as error:
                raise AssertionError(
                    f"the python block at {block.page}:{block.line} fails: "
                    f"{type(error).__name__}: {error}"
                ) from error
    finally:
        if spark is not None:
            for query in spark.streams.active:
                query.stop()
