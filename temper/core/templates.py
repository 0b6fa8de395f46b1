"""Prompt templates are ``str.format`` strings over a record's columns, written in YAML by people.

``str.format`` also evaluates attribute and index lookups (``{question.__class__.__init__.__globals__}``)
and nested fields inside a format spec (``{question:{question.__class__}}``); either would let a
catalog file read interpreter internals into a prompt or a judge call. So a template may name plain
columns only, anywhere in it, and this is checked when the file is loaded.
"""

from __future__ import annotations

import string


def template_columns(template: str) -> list[str]:
    """The column names ``template`` reads, in order; ValueError for anything but a plain name."""
    columns: list[str] = []
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"template field {{{field}}} is not a column name (attribute, index and positional "
                             "fields are not allowed)")
        columns.append(field)
        if spec and "{" in spec:
            columns += template_columns(spec)
    return columns
