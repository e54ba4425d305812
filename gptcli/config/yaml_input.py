"""YAML from outside (config files), read as data with bounds: read_yaml.

yaml.safe_load never runs code, but on its own it accepts three things a config file
should not do: nest deeper than Python's recursion (a RecursionError), expand aliases into
gigabytes (a few lines of `&a [*b, *b, ...]` make a billion-element list as soon as
anything walks it), and give a key twice, keeping the last silently. Here the event stream
is checked first, without building anything (depth, and the size that aliases expand to),
and duplicate keys are refused naming both lines.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from gptcli.errors import UsageError

MAX_DEPTH = 32  # a config is two levels deep; lists add one
MAX_NODES = 100_000  # scalars and collections, once every alias is expanded


def _check_events(text: str, source: str) -> None:
    """Depth and expanded size from the parser's events, which come one at a time (no
    recursion, nothing built): an alias counts as the whole node it names."""
    import yaml  # here, not at the top: `gptcli --help` never needs it

    anchored: dict[str, int] = {}  # anchor -> expanded size of its node
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, size so far)
    total = 0

    def add(size: int) -> None:
        nonlocal total
        total += size
        if stack:
            anchor, n = stack[-1]
            stack[-1] = (anchor, n + size)
        if total > MAX_NODES:
            raise UsageError(
                f"{source} expands to more than {MAX_NODES:,} values (through its aliases, *name); "
                "a config file needs a few dozen: write the values out"
            )

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) >= MAX_DEPTH:
                line = event.start_mark.line + 1
                raise UsageError(
                    f"{source}:{line}: nested more than {MAX_DEPTH} levels deep; a config is 2 or 3"
                )
            stack.append((event.anchor, 1))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = stack.pop()
            if anchor is not None:
                anchored[anchor] = size
            add(size)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchored[event.anchor] = 1
            add(1)
        elif isinstance(event, yaml.AliasEvent):
            add(anchored.get(event.anchor, 1))


@functools.cache
def _loader() -> type:
    """safe_load's loader, refusing a key given twice in one mapping (made at first use, so
    that importing this module does not import PyYAML)."""
    import yaml

    class Loader(yaml.SafeLoader):
        source = "the config"

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges; keys after it override on purpose
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first != line:
                    raise UsageError(
                        f"{self.source}: '{key}' is given twice (lines {first} and {line}); keep one"
                    )
            return super().construct_mapping(node, deep=deep)

    # YAML 1.2's floats, which YAML 1.1 (PyYAML) reads as strings where they have no dot or
    # exponent sign: `lr: 1e-3` and `max_iters: 1e3` are numbers, as in Python and JSON
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def load(text: str, source: str) -> Any:
    """The data of a YAML document from outside (source names it in errors)."""
    import yaml

    try:
        _check_events(text, source)
        loader = _loader()(text)
        loader.source = source
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{where} is not valid YAML ({what})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file's data: a file (not a directory or device), UTF-8, bounded in
    depth and alias expansion, no key given twice (gptcli/safe_yaml.py)."""
    from gptcli.data.inputs import check_input
    from gptcli.messages import printable

    path = Path(path)
    check_input(path, "config file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise UsageError(
            f"config file {printable(str(path), 300)} is {path.stat().st_size:,} bytes; a config is a "
            f"few hundred (at most {MAX_CONFIG_BYTES:,})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not valid YAML (not UTF-8 text at byte {e.start})") from None
    data = load(text, str(path))
    return data or {}


MAX_CONFIG_BYTES = 1 << 20
