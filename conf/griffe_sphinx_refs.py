"""A griffe extension of the docs site (mkdocs.yml): the docstrings' cross-references, Sphinx
roles such as ``:meth:`ack``` or ``:class:`~spark_queue.Consumer```, become links to the API
reference where the name has an entry there, and code where it has none.

The package's docstrings are Google style (``Args:``, ``Returns:``, ``Raises:``) with Sphinx
roles for cross-references, so ``help()`` reads them as written; this turns the roles into
mkdocs-autorefs references, resolved in the scope of the object whose docstring names them
(``:meth:`ack``` in a method of ``QueueTable`` is ``QueueTable.ack``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:meth|class|func|data|mod|attr|exc|obj):`(~?)([\w.]+)`")


def _resolved(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as written in ``obj``'s docstring, or ``name`` itself."""
    first, _, rest = name.partition(".")
    try:
        path = obj.resolve(first)
    except griffe.NameResolutionError:
        return name
    return f"{path}.{rest}" if rest else path


def _rewritten(obj: griffe.Object, text: str) -> str:
    def reference(match: re.Match) -> str:
        short, name = match.group(1), match.group(2)
        shown = name.rsplit(".", 1)[-1] if short else name
        target = _resolved(obj, name)
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(reference, text)


class SphinxReferences(griffe.Extension):
    """Rewrites the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _rewritten(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)
