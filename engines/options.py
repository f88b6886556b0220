"""Checking configured values against the types their code declares: the config file's
sections (``gateway.config``) and the option tables handed to an engine's constructor
(``[tts.options]``, ``[tts.fallback_policy]``, ...). TOML has types, and a wrong one used to
pass: ``insecure_bind = "false"`` was true, and ``first_chunk_timeout_s = "soon"`` started a
gateway whose every turn then failed comparing a float with a string.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Union, get_args, get_origin, get_type_hints


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type (the few a configured value uses; a hint
    this cannot check, such as a ``Callable`` or a ``Literal``, lets any value through: the
    code that takes it says what is wrong)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, tuple) and all(matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and matches(v, args[1]) for k, v in value.items())
    return not isinstance(hint, type) or isinstance(value, hint)


def mismatch(value: Any, hint: Any, where: str) -> tuple[str, Any, Any] | None:
    """Where ``value`` (at key ``where``) is not of the annotated type, down to the
    innermost key of a table: ("tts.profiles.cpu.first_s", float, "fast"), not the whole
    table as "must be a table" of a value that is one. None when it matches."""
    if matches(value, hint):
        return None
    if get_origin(hint) is dict and isinstance(value, dict):
        for key, item in value.items():
            found = mismatch(item, get_args(hint)[1], f"{where}.{key}")
            if found is not None:
                return found
    return where, hint, value


def describe(hint: Any) -> str:
    """``hint`` as the text of a refusal: "a number", "a list of strings", ..."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args if arg is not type(None))
    if origin is tuple:
        return f"a list of {describe(args[0]).removeprefix('a ')}s"
    if origin is dict:
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def check_options(cls: Any, options: dict[str, Any], what: str,
                  given: tuple[str, ...] = (), names: dict[str, str] | None = None) -> None:
    """``options`` for ``cls``'s constructor: a required one missing (qwen3 without its
    model), an unknown one, or one of the wrong type, as a ``ValueError`` naming it and
    listing what ``cls`` takes (but ``given``, the arguments the code passes itself).
    ``names``: what the operator calls an option the config renames (``ref_audio`` is
    ``[tts] voice_ref``), for a refusal of one the engine does not take or needs and did
    not get (qwen3's ``model``: "missing a required argument: 'model'" named no flag).
    Ranges are the constructor's to check."""
    signature = inspect.signature(cls)
    params = signature.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for key, label in (names or {}).items():
            if key in options and key not in params:
                raise ValueError(f"{what} takes no {label} ({_takes(signature, given)})")
    for key, label in (names or {}).items():
        param = params.get(key)
        if param is not None and param.default is param.empty and key not in options:
            raise ValueError(f"{what} needs its {label} ({_takes(signature, given)})")
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise ValueError(f"{what} cannot be set up with the options given: {exc} "
                         f"({_takes(signature, given)})") from None
    try:
        hints = get_type_hints(cls.__init__)
    except NameError:  # an annotation only imported for type checking: nothing to check
        hints = {}
    for name, value in options.items():
        hint = hints.get(name)
        found = None if hint is None else mismatch(value, hint, name)
        if found is not None:
            key, want, bad = found
            raise ValueError(f"{what}: {key} must be {describe(want)}, not {bad!r} "
                             f"({_takes(signature, given)})")


def _takes(signature: inspect.Signature, given: tuple[str, ...]) -> str:
    """What a constructor takes, for a refusal: its options with their defaults (not a
    function, such as a test's clock)."""
    options = [p.name if p.default is p.empty else f"{p.name} = {p.default!r}"
               for p in signature.parameters.values()
               if p.kind is not p.VAR_POSITIONAL and p.kind is not p.VAR_KEYWORD
               and p.name not in given
               and (p.default is p.empty or not callable(p.default))]
    more = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return "it takes " + (", ".join(options) or "no options") + \
        (", and the model's own" if more else "")
