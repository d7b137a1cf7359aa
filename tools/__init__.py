"""Tools of the repository, run with ``make`` and by the tests: not part of the package, which
neither imports nor ships them (``argument_docs``: the arguments page)."""
