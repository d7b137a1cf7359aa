"""The static declarations of arguments (dataclasses, keyword types, signatures) are checked
against the specification when their modules are imported: a declaration that drifts fails
at import, in every process. No Spark."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import Literal, TypedDict

import pytest

from spark_queue.model.arguments import ARGUMENTS, arguments_of
from spark_queue.model.declarations import (
    DeclarationError,
    check_dataclass,
    check_keywords,
    check_signature,
)
from spark_queue.model.queue_arguments import ConsumerLimits, parse_consumer_limits

ROOT = Path(__file__).resolve().parents[1]
PUBLISHER = arguments_of("publisher")
OnReject = Literal["drop", "fail"]


@dataclass
class Publisher:
    linger: int = 5
    max_batch: int = 1000
    on_reject: OnReject = "drop"


def test_a_dataclass_with_the_specifications_fields_passes():
    check_dataclass(Publisher, PUBLISHER, "publisher")


def drifted(name: str, *fields: tuple[str, object, object], base: bool = True) -> type:
    """A dataclass of ``fields`` (name, type, default), on :class:`Publisher`'s if ``base``."""
    return make_dataclass(name, fields, bases=(Publisher,) if base else ())


MissingField = drifted(
    "MissingField", ("linger", int, 5), ("on_reject", OnReject, "drop"), base=False
)
ExtraField = drifted("ExtraField", ("max_batches", int, 1))
OtherDefault = drifted("OtherDefault", ("max_batch", int, 100))
OtherChoices = drifted("OtherChoices", ("on_reject", Literal["drop", "ignore"], "drop"))
ChoicesReordered = drifted("ChoicesReordered", ("on_reject", Literal["fail", "drop"], "drop"))
OtherType = drifted("OtherType", ("max_batch", float, 1000))
NoneAdmitted = drifted("NoneAdmitted", ("max_batch", int | None, 1000))


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (MissingField, "MissingField differs from the argument specification: arguments "),
        (ExtraField, "ExtraField differs from the argument specification: fields "),
        (OtherDefault, "OtherDefault.max_batch defaults to 100; the argument specification's "),
        (OtherChoices, "OtherChoices.on_reject is typed Literal['drop', 'ignore']; "),
        (ChoicesReordered, "ChoicesReordered.on_reject is typed Literal['fail', 'drop']; "),
        (OtherType, "OtherType.max_batch is typed float; the argument specification's kind "),
        (NoneAdmitted, "NoneAdmitted.max_batch admits None; the argument specification "),
    ],
)
def test_a_drifted_dataclass_is_refused_naming_the_field(declared: type, message: str):
    with pytest.raises(DeclarationError) as refused:
        check_dataclass(declared, PUBLISHER, "publisher")
    assert str(refused.value).startswith(message), refused.value


def test_held_fields_are_a_consumers_limits_with_their_sentinels():
    limits = [ARGUMENTS[name] for name in ("lease_period", "max_deliveries")]

    @dataclass
    class Held:
        lease_period_us: int | None = None
        max_deliveries: int = 0

    check_dataclass(Held, limits, "source", held=True)

    @dataclass
    class NoneForNoLimit:
        lease_period_us: int | None = None
        max_deliveries: int | None = None  # a consumer's limits hold 0 for none

    with pytest.raises(DeclarationError, match=r"NoneForNoLimit.max_deliveries "):
        check_dataclass(NoneForNoLimit, limits, "source", held=True)


class Keywords(TypedDict, total=False):
    linger: int | str | dt.timedelta
    max_batch: int
    on_reject: Literal["drop", "fail"]


class DurationAsInt(TypedDict, total=False):
    linger: int
    max_batch: int
    on_reject: Literal["drop", "fail"]


class KeyMissing(TypedDict, total=False):
    linger: int | str | dt.timedelta
    on_reject: Literal["drop", "fail"]


def test_a_keyword_type_is_checked_as_keywords_are_typed():
    check_keywords(Keywords, "publisher")
    with pytest.raises(DeclarationError, match=r"^DurationAsInt.linger is typed int; "):
        check_keywords(DurationAsInt, "publisher")
    with pytest.raises(DeclarationError, match=r"arguments \['max_batch'\] have no key"):
        check_keywords(KeyMissing, "publisher")


def test_a_signature_is_checked_for_its_keywords_and_their_defaults():
    def publisher(
        queue: str,
        *,
        linger: int = 5,
        max_batch: int = 1000,
        on_reject: Literal["drop", "fail"] = "drop",
    ) -> None: ...

    def lingers_longer(
        queue: str,
        *,
        linger: int | str | dt.timedelta = 50,
        max_batch: int = 1000,
        on_reject: Literal["drop", "fail"] = "drop",
    ) -> None: ...

    def stub(queue: str, *, linger: int = ..., max_batch: int = ..., on_reject: str = ...):
        """A stub's ``...`` defaults are not checked, nor, untyped, its types."""

    check_signature(publisher, "publisher", typed=False)
    check_signature(stub, "publisher", typed=False)
    with pytest.raises(DeclarationError, match=r"publisher\(linger=\) is typed int; "):
        check_signature(publisher, "publisher")
    with pytest.raises(DeclarationError, match=r"lingers_longer\(linger=\) defaults to 50; "):
        check_signature(lingers_longer, "publisher")
    with pytest.raises(DeclarationError, match=r"keywords \['queue'\] are no arguments"):
        check_signature(lambda queue="q", **rest: None, "publisher", typed=False)


def test_a_scopes_default_is_its_signatures():
    assert ARGUMENTS["max_messages"].default_in("lease") == 100
    assert ARGUMENTS["max_messages"].default_in("source") is None
    assert ARGUMENTS["lease_period"].default_in("consumer") == "30 seconds"


def test_a_consumers_limits_hold_sentinels_and_microseconds():
    limits = parse_consumer_limits(
        {"max_deliveries": 0, "max_cancels": -1, "lease_period": "1.5s"}, surface="keyword"
    )
    assert limits == ConsumerLimits("default", 1_500_000, None, None, 0, 0)


def test_a_drifted_declaration_fails_the_import(tmp_path: Path):
    """Another default in the specification than in ``QueueTable.lease``: importing the
    package fails, in a process of its own, naming the keyword."""
    drifted = tmp_path / "spark_queue"
    shutil.copytree(ROOT / "spark_queue", drifted, ignore=shutil.ignore_patterns("__pycache__"))
    spec = drifted / "model" / "arguments.py"
    text = spec.read_text(encoding="utf-8")
    assert 'defaults={"lease": 100}' in text
    spec.write_text(text.replace('defaults={"lease": 100}', 'defaults={"lease": 10}'))
    imported = subprocess.run(
        [sys.executable, "-c", "import spark_queue"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 1
    assert imported.stderr.strip().splitlines()[-1] == (
        "spark_queue.model.declarations.DeclarationError: QueueTable.lease(max_messages=) "
        "defaults to 100; the argument specification's default is 10"
    )
