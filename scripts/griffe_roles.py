"""A griffe extension for the API reference (mkdocs.yml loads it): the docstrings name
other objects with Sphinx roles (``:class:`Store```, ``:meth:`run```, ``:func:`~a.b.c```),
which Google-style Markdown would show as literal text. Each role becomes a code span that
links to the object's reference entry when the site renders it, and stays plain code when
it has none (a private helper, a relative method name no page shows): an *optional*
cross-reference of mkdocs-autorefs, so an unresolved name is no build warning.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|data|mod|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _qualified(obj: griffe.Object, target: str) -> str:
    """``target`` as a full dotted path, resolved in ``obj``'s scope when it can be."""
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except (griffe.NameResolutionError, ValueError):
        if obj.is_class or obj.parent is None:
            return target
        try:  # a method named relative to its class (``:meth:`notify```)
            return f"{obj.parent.path}.{target}" if head in obj.parent.members else target
        except Exception:
            return target
    return f"{resolved}.{rest}" if rest else resolved


def _rewrite(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        target = " ".join(match["target"].split())
        title = None
        if target.endswith(">") and "<" in target:  # Sphinx's ``title <target>``
            title, _, target = target[:-1].partition("<")
            title = title.strip()
        target = target.strip().rstrip("()")
        shown = title or (target.rsplit(".", 1)[-1] if match["tilde"] else target)
        identifier = _qualified(obj, target)
        return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(link, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of the loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = _rewrite(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)  # type: ignore[misc]
