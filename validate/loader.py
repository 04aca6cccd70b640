"""YAML loading into pydantic models with errors that name the file, line and key."""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from validate.errors import InputError

M = TypeVar("M", bound=BaseModel)


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key, for error messages."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping = yaml.SafeLoader.construct_mapping(loader, node, deep=deep)
    lines = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str):
            if key in lines:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {lines[key]})", key_node.start_mark)
            lines[key] = key_node.start_mark.line + 1
    mapping_with_lines = _LineDict(mapping)
    mapping_with_lines.key_lines = lines
    return mapping_with_lines


class _LineDict(dict):
    key_lines: dict[str, int]


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> Any:
    """Parse ``path`` as YAML. Raises InputError naming the file (and line) when it is missing or malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    try:
        return yaml.load(text, Loader=_LineLoader)
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a configuration or suite file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{where}: malformed YAML: {getattr(e, 'problem', e)}") from None


def line_of(data: Any, loc: tuple) -> int | None:
    """Line (1-based) of the deepest key of ``loc`` that YAML parsed by :func:`read_yaml` remembers, or None."""
    line = None
    node = data
    for part in loc:
        if isinstance(node, _LineDict) and isinstance(part, str):
            line = node.key_lines.get(part, line)
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            break
    return line


def format_validation_error(path: Path, data: Any, err: ValidationError) -> str:
    """One line per problem: ``file:line: key.path: message``."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc if str(p) != "") or "(top level)"
        line = line_of(data, loc)
        where = f"{path}:{line}" if line else str(path)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{where}: {key}: {msg}")
    return "\n".join(lines)


def load_model(path: Path, model: type[M], data: Any = None) -> M:
    """Validate the YAML at ``path`` (or already parsed ``data``) as ``model``.

    Raises:
        InputError: naming the file, the line and the key of every problem.
    """
    if data is None:
        data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise InputError(format_validation_error(path, data, err)) from None
