"""A griffe extension of the docs site (mkdocs.yml): a method built by ``results_only``
(``publish = results_only(publish_outcome, doc)`` in ``QueueTable``, so that both take one
signature, declared once) is an assignment to a reader of the source; the reference shows it
as the method it is: the parameters of the method it is built from, the ``PublishResult`` it
returns, and its own docstring, as ``help()`` shows it.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import griffe

BUILDER = "results_only"
RETURNS = "PublishResult"


class ResultsOnly(griffe.Extension):
    """Turns each ``name = results_only(method, doc)`` of a class into a method."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for name, member in list(cls.members.items()):
            value = None if member.is_alias else getattr(member, "value", None)
            if not (isinstance(value, griffe.ExprCall) and str(value.function) == BUILDER):
                continue
            source, doc = value.arguments
            declared = cls.members[str(source)]
            method = griffe.Function(
                name,
                lineno=member.lineno,
                endlineno=member.endlineno,
                parameters=declared.parameters,
                returns=griffe.ExprName(RETURNS, parent=cls),
            )
            method.docstring = griffe.Docstring(
                inspect.cleandoc(ast.literal_eval(str(doc))),
                lineno=member.lineno,
                endlineno=member.endlineno,
                parent=method,
                parser=declared.docstring.parser,  # the loader's style, as every docstring's
                parser_options=declared.docstring.parser_options,
            )
            cls.set_member(name, method)
