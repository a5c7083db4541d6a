"""Reading a configuration file safely: bounded bytes in, YAML data and line numbers out.

A ``models.yaml`` is a few kilobytes of hand-written text. Whatever path a person (or a typo)
hands over — a FIFO, ``/dev/zero``, a directory, a 50 MB log, a binary, a file that is not UTF-8,
YAML nested a hundred thousand levels deep, or an alias bomb — is refused with one line naming the
file (and line) and what would be valid, before more than :data:`MAX_CONFIG_BYTES` are read or more
than :data:`MAX_YAML_NODES` YAML nodes are built. Nothing here raises anything but
:class:`SourceError`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The largest configuration file read. Real ones are a few KB (examples/university.yaml: ~3 KB;
#: fifty models at ~30 lines each are ~50 KB): 1 MiB is far beyond any, and keeps a mistaken path
#: (a log, a checkpoint) from being read whole.
MAX_CONFIG_BYTES = 1 << 20
#: YAML nesting levels at most. The schema nests five (models[0].slo.ttft_s); PyYAML's composer
#: recurses once per level, so 100,000 levels raised RecursionError (issue 16).
MAX_YAML_DEPTH = 32
#: YAML nodes at most after expanding aliases. A real file has hundreds; a six-level alias bomb
#: (each level nine aliases of the one above) expands to 9**6 = 531,441 and took 12 s and 2.2 GB.
MAX_YAML_NODES = 100_000

#: A field's path in the file: mapping keys and list indexes, ``("models", 1, "slo")``
FieldPath = tuple[str | int, ...]
#: The 1-based line of every field path of a file
FieldLines = dict[FieldPath, int]


class SourceError(ValueError):
    """The file cannot be a configuration; ``problem`` is one line naming file (and line)."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(problem)


@dataclass(frozen=True)
class YamlSource:
    """A parsed file: its plain data and the 1-based line of every field path."""

    data: Any
    lines: FieldLines


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def read_text(path: str | Path) -> str:
    """The UTF-8 text of the regular file at ``path``, at most :data:`MAX_CONFIG_BYTES`.

    Checks the file's type before opening it (a FIFO would block, ``/dev/zero`` never ends) and
    again on the open descriptor (the path may be swapped in between); opens without blocking.
    """
    file = Path(path)
    try:
        info = os.stat(file)
    except OSError as exc:
        raise SourceError(f"{file}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SourceError(
            f"{file}: is a {_kind(info.st_mode)}, not a regular file; give the path of a YAML file"
        )
    if info.st_size > MAX_CONFIG_BYTES:
        raise SourceError(_too_big(file, info.st_size))
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise SourceError(f"{file}: cannot read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError(f"{file}: is no longer a regular file; give the path of a YAML file")
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise SourceError(f"{file}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CONFIG_BYTES:
        raise SourceError(_too_big(file, len(data)))
    nul = data.find(b"\0")
    if nul >= 0:
        raise SourceError(
            f"{file}:{_line_of(data, nul)}: a NUL byte: this is a binary file, not YAML text"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"{file}:{_line_of(data, exc.start)}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start}); save the file as UTF-8"
        ) from None


def _too_big(file: Path, size: int) -> str:
    return (
        f"{file}: {size:,} bytes; a configuration file is at most {MAX_CONFIG_BYTES:,} bytes "
        "(is this the right file?)"
    )


# --------------------------------------------------------------------------- bounded YAML


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, nesting beyond :data:`MAX_YAML_DEPTH` and
    unhashable keys (PyYAML keeps the last duplicate silently and recurses without bound)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # PyYAML's own signature
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_YAML_DEPTH} levels; a models.yaml nests a few",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode,
                       deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain word, not a list or mapping",
                key_node.start_mark,
            ) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, file: str) -> None:
    """Refuse a node graph whose alias-expanded size or depth is beyond the limits, or which
    contains itself (``&a [*a]``), before anything walks it as a tree."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded depth)
    active: set[int] = set()

    def visit(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            size, height = sizes[key]
        else:
            if key in active:
                raise SourceError(
                    f"{file}:{node.start_mark.line + 1}: an alias refers to a node that "
                    "contains it; a configuration cannot contain itself"
                )
            if depth > MAX_YAML_DEPTH * 4:
                # aliases nest nodes deeper than the text does; bound the walk itself
                raise SourceError(
                    f"{file}:{node.start_mark.line + 1}: aliases nest the file deeper than "
                    f"{MAX_YAML_DEPTH * 4} levels"
                )
            active.add(key)
            size, height = 1, 1
            for child in _children(node):
                child_size, child_height = visit(child, depth + 1)
                size += child_size
                height = max(height, child_height + 1)
                if size > MAX_YAML_NODES:
                    break
            active.discard(key)
            sizes[key] = (size, height)
        if size > MAX_YAML_NODES:
            raise SourceError(
                f"{file}:{node.start_mark.line + 1}: expands to more than {MAX_YAML_NODES:,} "
                "values (through aliases); a models.yaml holds hundreds"
            )
        return size, height

    visit(root, 1)


def _line_index(node: yaml.Node, path: FieldPath = (),
                out: FieldLines | None = None) -> FieldLines:
    """Map every field path (``('models', 1, 'slo')``) to its 1-based line in the file."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            out.setdefault(path + (key,), key_node.start_mark.line + 1)
            _line_index(value_node, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out.setdefault(path + (index,), item.start_mark.line + 1)
            _line_index(item, path + (index,), out)
    return out


def _yaml_problem(exc: yaml.YAMLError, text: str, file: str) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line = mark.line + 1
    elif getattr(exc, "position", None) is not None:  # ReaderError: a character YAML forbids
        line = text.count("\n", 0, exc.position) + 1
    else:
        line = 1
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    problem = "; ".join(p for p in parts if p) or getattr(exc, "reason", None) or str(exc)
    character = getattr(exc, "character", None)
    if character is not None:  # ReaderError: an int code point (str input) or a byte
        code = character if isinstance(character, int) else ord(character)
        problem = f"{problem} (character U+{code:04X}); write plain printable text"
    return f"{file}:{line}: not valid YAML: {problem}"


def parse_yaml(text: str, file: str) -> YamlSource:
    """Parse one YAML document with bounded work; raise :class:`SourceError` naming the line."""
    try:
        loader = _BoundedLoader(text)  # the reader refuses forbidden characters here
    except yaml.YAMLError as exc:
        raise SourceError(_yaml_problem(exc, text, file)) from None
    try:
        root = loader.get_single_node()
        if root is None:
            return YamlSource(None, {})
        _check_expansion(root, file)
        lines = _line_index(root)
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise SourceError(_yaml_problem(exc, text, file)) from None
    finally:
        loader.dispose()
    return YamlSource(data, lines)


def load_yaml(path: str | Path) -> YamlSource:
    """Read (:func:`read_text`) and parse (:func:`parse_yaml`) the file at ``path``."""
    return parse_yaml(read_text(path), str(path))
