"""A griffe extension of the docs site (mkdocs.yml): a class whose docstring the package
completes as it is imported (``QueueArguments``' attributes, written from the argument
specification) is documented with the docstring it has at run time, as ``help()`` shows it.
Listed before the cross-reference extension, which then rewrites it as any other.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


def _runtime_docstring(cls: griffe.Class) -> str | None:
    """The docstring of the class ``cls`` as the imported package has it, or None where
    its module does not import (an optional dependency missing)."""
    try:
        found: Any = importlib.import_module(cls.module.path)
    except ImportError:
        return None
    for name in cls.path.removeprefix(cls.module.path + ".").split("."):
        found = getattr(found, name, None)
    return inspect.getdoc(found) if inspect.isclass(found) else None


class RuntimeDocstrings(griffe.Extension):
    """Replaces a class's docstring, as it is loaded, where the imported class has another
    one."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.docstring is None:
            return
        runtime = _runtime_docstring(cls)
        if runtime is not None and runtime != cls.docstring.value:
            cls.docstring.value = runtime
