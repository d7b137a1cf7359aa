"""Pickles that find their way back to this copy of ``spark_queue``.

Spark pickles the connector's objects (the data source, readers, writers, partitions, commit
messages) in one Python worker and unpickles them in another. Where ``spark_queue`` is not
installed but shipped with the session (``--py-files``, a Spark Connect artifact), PySpark
4.2 does not give every such worker the session's Python files: the streaming source's
driver-side runner never gets them, and on a Spark Connect server a streaming query's tasks
did not always (a restarted query's write tasks failed with "No module named
'spark_queue'"). A :class:`Portable` object pickles its class as "append the folder (or zip)
this copy was imported from to ``sys.path``, then import the class", in the standard
library's functions alone, so it loads wherever that folder exists: the driver, and in local
mode the executors. Where ``spark_queue`` is importable anyway, the appended path is never
reached: an import finds the installed copy first.
"""

from __future__ import annotations

import copyreg
import importlib
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsIndex, cast

ROOT = str(Path(__file__).resolve().parent.parent)
# pickle's helpers in copyreg, which its type stubs leave out.
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]
_RECONSTRUCTOR = copyreg._reconstructor  # type: ignore[attr-defined]


class _Call:
    """Pickles as ``function(*args)``, evaluated when unpickled: a pickle of these holds only
    the standard library's functions, so loading it needs nothing of ``spark_queue``."""

    def __init__(self, function: Callable[..., object], *args: object) -> None:
        self.function = function
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.function, self.args)


def portable_class(cls: type) -> _Call:
    """``cls``, as a pickle that appends :data:`ROOT` to ``sys.path`` (where it is not there
    yet) before importing it."""
    sys_path = _Call(getattr, _Call(importlib.import_module, "sys"), "path")
    # sys.path[:] = dict.fromkeys(sys.path + [ROOT]): ROOT at the end, once, however many
    # pickles a reused worker loads; the order of the rest kept. setitem returns None:
    # import_module's ``package``, unused for an absolute name.
    once = _Call(dict.fromkeys, _Call(operator.add, sys_path, [ROOT]))
    appended = _Call(operator.setitem, sys_path, slice(None), _Call(list, once))
    module = _Call(importlib.import_module, cls.__module__, appended)
    return _Call(getattr, module, cls.__qualname__)


class Portable:
    """A mixin: instances pickle as usual (state, ``__getstate__``), but with their class
    found through :func:`portable_class`."""

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # object's reduction of an instance is a tuple (text is for module-level names).
        function, args, *rest = cast(tuple[Any, ...], super().__reduce_ex__(protocol))
        if function is _NEWOBJ and args == (type(self),):
            # pickle writes __newobj__ as an opcode that takes the class itself; the
            # protocol 0 spelling of the same call, object.__new__(cls), takes any argument.
            function, args = _RECONSTRUCTOR, (portable_class(type(self)), object, None)
        return (function, args, *rest)
