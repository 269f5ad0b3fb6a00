"""Finding a topology by reference: ``path/to/file.py[:name]`` or ``package.module[:name]``.

Topologies travel between processes by reference, never pickled: every
process that runs a job loads it again from the same reference.

A reference may name a function that builds the topology; ``params`` are
then passed to it as keyword arguments, each given as text and converted by
:func:`convert_param` (the rule ``streamlet run --param`` documents).
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from types import ModuleType
from typing import Any

from streamlet.core.model.topology import Topology
from streamlet.errors import StreamletError
from streamlet.job_code import load_module

PARAM_RULE = (
    "VALUE becomes an int (42, 1_000), a float (2.5), a bool (true, false) or JSON (null, [1, 2], "
    '{"a": 1}, "007") where it parses as one, tried in that order, and stays text otherwise; a parameter '
    "annotated str always gets the text, one annotated Path a Path."
)


def load_topology(
    target: str,
    parallelism: dict[str, int] | None = None,
    params: Mapping[str, str] | None = None,
    *,
    digest: str | None = None,
) -> Topology:
    """The topology ``target`` names, with ``parallelism`` overrides applied.

    ``name`` may be a Topology object or a function returning one; without it
    the module's single Topology is used, or else its ``build_topology``.
    ``params`` (name -> text) go to that function as keyword arguments, each
    converted by :func:`convert_param`; a Topology object takes none. The
    module is run from its file's bytes under a private name
    (:mod:`streamlet.job_code`); with ``digest`` (a signed spec's), those
    bytes must have that SHA-256.
    """
    location, _, name = target.partition(":")
    module = load_module(location, digest)
    found = _pick(module, location, name)
    topology = _build(found, target, location, params or {})
    for node_name, count in (parallelism or {}).items():
        if node_name not in topology.nodes:
            raise StreamletError(f"{target} has no node called '{node_name}'")
        topology.nodes[node_name].parallelism = count
    return topology


def _build(found: Any, target: str, location: str, params: Mapping[str, str]) -> Topology:
    if isinstance(found, Topology):
        if params:
            raise StreamletError(
                f"{target} is a Topology object, not a function that builds one: it takes no parameters "
                f"(given: {', '.join(params)})"
            )
        return found
    topology = call_factory(found, params, location) if callable(found) else found
    if not isinstance(topology, Topology):
        raise StreamletError(f"{target} is not a Topology or a function returning one (got {type(topology).__name__})")
    return topology


def _pick(module: ModuleType, location: str, name: str) -> Any:
    if name:
        if not hasattr(module, name):
            raise StreamletError(f"{location} has no attribute '{name}'")
        return getattr(module, name)
    topologies = [value for value in vars(module).values() if isinstance(value, Topology)]
    if len(topologies) == 1:
        return topologies[0]
    builder = getattr(module, "build_topology", None)
    if builder is not None and inspect.isfunction(builder):
        return builder
    raise StreamletError(
        f"{location}: name the topology, as {location}:NAME ({len(topologies)} Topology objects found)"
    )


def call_factory(factory: Callable[..., Any], params: Mapping[str, str], location: str) -> Any:
    """``factory(**params)``, each value converted for its parameter; a one-line error for an unknown
    parameter or a required one left out, naming the function and its parameters, before calling it."""
    signature = _signature(factory)
    if signature is None:  # a builtin without introspection: let Python check the call
        return factory(**{key: convert_param(raw) for key, raw in params.items()})
    accepted = {
        name: parameter
        for name, parameter in signature.parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    takes_any = any(parameter.kind is parameter.VAR_KEYWORD for parameter in signature.parameters.values())
    where = f"{location}:{getattr(factory, '__name__', type(factory).__name__)}({describe_parameters(signature)})"
    unknown = [key for key in params if key not in accepted and not takes_any]
    if unknown:
        raise StreamletError(f"{where} has no parameter {_quoted(unknown)}")
    missing = [name for name, parameter in accepted.items() if parameter.default is parameter.empty]
    missing = [name for name in missing if name not in params]
    if missing:
        raise StreamletError(f"{where} needs a value for {_quoted(missing)}")
    kwargs = {key: convert_param(raw, _annotation(factory, accepted.get(key))) for key, raw in params.items()}
    return factory(**kwargs)


def convert_param(raw: str, annotation: Any = None) -> Any:
    """``raw`` as the value of a parameter annotated ``annotation`` (see :data:`PARAM_RULE`)."""
    kinds = _union_members(annotation) - {type(None)}
    if kinds == {str}:
        return raw
    if any(_is_path_type(kind) for kind in kinds) and all(kind is str or _is_path_type(kind) for kind in kinds):
        return Path(raw)
    for parse in (_as_int, _as_float, _as_bool, _as_json):
        try:
            return parse(raw)
        except ValueError:
            continue
    return raw


def describe_parameters(signature: inspect.Signature) -> str:
    """``events: int = 300000, output: Path`` style: what a user may pass, annotations as written."""
    parts = []
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY):
            continue  # not passable by name
        if parameter.kind is parameter.VAR_KEYWORD:
            parts.append(f"**{name}")
            continue
        text = name
        if parameter.annotation is not parameter.empty:
            annotation = parameter.annotation
            text += ": " + _annotation_text(annotation)
        if parameter.default is not parameter.empty:
            text += f" = {parameter.default!r}"
        parts.append(text)
    return ", ".join(parts)


def _annotation_text(annotation: Any) -> str:
    """An annotation as its author wrote it: ``Path``, not ``pathlib.Path``."""
    if isinstance(annotation, str):
        return annotation  # from __future__ import annotations: the text itself
    if isinstance(annotation, type):
        return annotation.__qualname__
    return inspect.formatannotation(annotation)


def _signature(factory: Callable[..., Any]) -> inspect.Signature | None:
    """The signature with its annotations as written (strings under ``from __future__ import annotations``)."""
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError):
        return None


def _annotation(factory: Callable[..., Any], parameter: inspect.Parameter | None) -> Any:
    """The parameter's annotation as an object, ``None`` when it has none.

    A string annotation (``from __future__ import annotations``) is evaluated
    in the function's module, as ``inspect.signature(eval_str=True)`` would,
    but one parameter at a time: a name imported only for type checking
    leaves that parameter unannotated instead of failing the others.
    """
    if parameter is None or parameter.annotation is parameter.empty:
        return None
    annotation = parameter.annotation
    if not isinstance(annotation, str):
        return annotation
    namespace = getattr(inspect.unwrap(factory), "__globals__", None)
    if namespace is None:
        return None
    try:
        return eval(annotation, namespace)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate only loses its conversion
        return None


def _union_members(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set(typing.get_args(annotation))
    return {annotation}


def _is_path_type(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, PurePath)


def _as_int(raw: str) -> int:
    return int(raw)


def _as_float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):  # "nan", "inf" are more likely names than numbers
        raise ValueError(raw)
    return value


def _as_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(raw)
    return lowered == "true"


def _as_json(raw: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    return json.loads(raw, parse_constant=refuse)  # JSONDecodeError is a ValueError


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)
