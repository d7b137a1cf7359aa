"""MkDocs hooks of the docs site (mkdocs.yml): the README is the home page, and the pages
stay readable on GitHub as they are.

- The repository's README.md is the site's ``index.md``; its links into ``docs/`` are
  rewritten to the site's pages (``docs/CLI.md`` is ``CLI.md`` there).
- The "Decisions" section of the navigation lists every ``docs/decisions/*.md``, its
  ``index.md`` first, so a new decision record is on the site without an edit here.
- A link from a page to the README goes to the home page; one to another file of the
  repository outside ``docs/`` (a source file) goes to that file under ``repo_url`` where
  mkdocs.yml sets one, else it is shown as the path in code.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

README = "README.md"
DECISIONS = "Decisions"
_README_DOCS_LINK = re.compile(r"\]\(docs/")
_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    decisions = Path(config.docs_dir) / "decisions"
    # The section's index first, then the records by name.
    names = sorted(path.name for path in decisions.glob("*.md"))
    pages = [f"decisions/{name}" for name in sorted(names, key=lambda name: name != "index.md")]
    for entry in config.nav or []:
        if isinstance(entry, dict) and DECISIONS in entry:
            entry[DECISIONS] = pages
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "index.md", abs_src_path=str(_root(config) / README)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == "index.md":
        markdown = _README_DOCS_LINK.sub("](", markdown)
    return _LINK.sub(lambda match: _outside_docs(match, page, config), markdown)


def _outside_docs(match: re.Match, page: Page, config: MkDocsConfig) -> str:
    """A link to a repository file outside ``docs/``: the README to the home page, another
    to ``repo_url``, or its path in code."""
    text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
    if "://" in target or target.startswith(("mailto:", "/")):
        return match.group(0)
    docs = Path(config.docs_dir).resolve()
    base = _root(config) if page.file.src_uri == "index.md" else docs
    folder = posixpath.dirname(page.file.src_uri) if base == docs else ""
    resolved = (base / folder / target).resolve()
    if resolved.is_relative_to(docs) or not resolved.exists():
        return match.group(0)
    path = resolved.relative_to(_root(config)).as_posix()
    if path == README:  # the home page
        home = posixpath.relpath("index.md", posixpath.dirname(page.file.src_uri) or ".")
        return f"[{text}]({home}{anchor})"
    if config.repo_url:
        return f"[{text}]({config.repo_url.rstrip('/')}/blob/main/{path}{anchor})"
    return text if text.startswith("`") else f"`{path}`"
