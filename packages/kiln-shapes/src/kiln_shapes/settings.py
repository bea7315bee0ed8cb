"""Typed settings read from the environment: the one helper every kiln package's ``config.py``
uses. It lives in kiln-shapes, the bottom package, so that every package can import it
without a new dependency arrow.

A package declares its settings once, as a frozen dataclass whose fields are ``setting(...)``s
(environment variable, default, help text, and whether the value changes compiled output and
so belongs in cache keys), and wraps that dataclass in :class:`Settings`::

    @dataclass(frozen=True)
    class Config:
        verify: bool = setting("KILN_VERIFY", False, "check the IR between passes")

    settings = Settings("kiln-x", Config)
    settings.verify                          # read now: there is no import-time snapshot
    settings.current()                       # a Config of every value, read now
    with settings.scope(verify=True): ...    # nestable; restored on exit, exceptions too

A value is the innermost scope's, else one assigned to the attribute (tests'
``monkeypatch.setattr``), else the environment's, else the default. Text is parsed by the
default's type: bool (:func:`parse_bool`, kiln's one boolean parser), int, float, str,
``frozenset`` (comma-separated); ``parse=`` overrides that. Unset or blank means the default.

Every ``Settings`` registers itself under its package name: :func:`registered` lists them,
so a cache that spans packages (kiln-inductor's artifact cache) keys on each one's
``affects_cache`` settings without importing them by name.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def parse_bool(raw: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``, in any case, spaces around ignored."""
    word = raw.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise ValueError(f"expected one of {'/'.join(TRUE)} or {'/'.join(FALSE)} (any case)")


def parse_set(raw: str) -> frozenset[str]:
    """Comma-separated words: ``"graphs, guards"`` -> ``{"graphs", "guards"}``."""
    return frozenset(word.strip() for word in raw.split(",") if word.strip())


@dataclasses.dataclass(frozen=True)
class Setting(Generic[T]):
    env: str
    default: T
    help: str
    affects_cache: bool = False  # changes compiled output: part of cache keys
    parse: Callable[[str], T] | None = None  # default: by the default's type
    also: tuple[str, ...] = ()  # variables read when ``env`` is unset (e.g. ``CXX``)

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The value ``environ`` (default: ``os.environ``, now) gives, else the default."""
        environ = os.environ if environ is None else environ
        for var in (self.env, *self.also):
            raw = environ.get(var)
            if raw and not raw.isspace():
                try:
                    return (self.parse or _parser(self.default))(raw)
                except ValueError as e:
                    raise ValueError(f"{var}={raw!r}: {e}") from None
        return self.default


def _parser(default: object) -> Callable[[str], Any]:
    if isinstance(default, bool):
        return parse_bool
    if isinstance(default, frozenset):
        return parse_set
    return type(default) if isinstance(default, int | float) else str


def setting(env: str, default: T, help: str, **options: Any) -> T:
    """A dataclass field declared as a :class:`Setting` (``affects_cache``, ``parse``, ``also``)."""
    declared = Setting(env, default, help, **options)
    return dataclasses.field(default=default, metadata={"setting": declared})


def cache_key(snapshot: object) -> str:
    """``name=value;...`` of a snapshot's settings that change compiled output."""
    parts = []
    for f in dataclasses.fields(snapshot):  # type: ignore[arg-type]
        if f.metadata["setting"].affects_cache:
            value = getattr(snapshot, f.name)
            text = ",".join(sorted(value)) if isinstance(value, frozenset) else value
            parts.append(f"{f.name}={text}")
    return ";".join(parts)


_REGISTRY: dict[str, Settings[Any]] = {}


def registered() -> dict[str, Settings[Any]]:
    """Every package's ``Settings`` created in this process, by package name."""
    return dict(_REGISTRY)


class Settings(Generic[C]):
    """One package's settings, read when asked for (module docstring)."""

    package: str
    schema: type[C]
    declared: dict[str, Setting[Any]]

    def __init__(self, package: str, schema: type[C]) -> None:
        declared = {f.name: f.metadata["setting"] for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
        clash = set(declared) & {*dir(Settings), "package", "schema", "declared"}
        if clash:
            raise TypeError(f"{package}: settings named like Settings' own attributes: {clash}")
        scopes: contextvars.ContextVar[dict[str, Any] | None]
        scopes = contextvars.ContextVar(f"{package} settings", default=None)
        vars(self).update(
            package=package, schema=schema, declared=declared, _pinned={}, _scopes=scopes
        )
        _REGISTRY[package] = self

    def __getattr__(self, name: str) -> Any:  # names not stored on the object: settings
        if name.startswith("_") or name not in vars(self).get("declared", {}):
            raise AttributeError(f"{vars(self).get('package')} has no setting {name!r}")
        return self._value(name, self._scopes.get() or {})

    def _value(self, name: str, scoped: dict[str, Any]) -> Any:
        if name in scoped:
            return scoped[name]
        return self._pinned[name] if name in self._pinned else self.declared[name].read()

    def __setattr__(self, name: str, value: Any) -> None:
        """Override for the process; ``del`` drops the override. So does assigning what the
        environment gives now: monkeypatch's undo (a ``del``, or in older pytest an
        assignment of the value it read) leaves the setting following the environment."""
        if name not in self.declared:
            raise AttributeError(f"{self.package} has no setting {name!r}")
        if value == self.declared[name].read():
            self._pinned.pop(name, None)
        else:
            self._pinned[name] = value

    def __delattr__(self, name: str) -> None:
        if name not in self.declared:
            raise AttributeError(f"{self.package} has no setting {name!r}")
        self._pinned.pop(name, None)

    def current(self) -> C:
        """Every setting's value now (scopes, assignments, environment, defaults)."""
        scoped = self._scopes.get() or {}
        return self.schema(**{name: self._value(name, scoped) for name in self.declared})

    def read(self, environ: Mapping[str, str] | None = None) -> C:
        """Every setting as ``environ`` (default: ``os.environ``) gives it: no scopes or
        assignments."""
        return self.schema(**{n: s.read(environ) for n, s in self.declared.items()})

    @contextlib.contextmanager
    def scope(self, **values: Any) -> Iterator[C]:
        """Override ``values`` inside the ``with`` block (this thread or task); yields the
        settings in force there."""
        unknown = sorted(set(values) - set(self.declared))
        if unknown:
            raise TypeError(
                f"unknown {self.package} settings: {unknown}; known: {sorted(self.declared)}"
            )
        token = self._scopes.set({**(self._scopes.get() or {}), **values})
        try:
            yield self.current()
        finally:
            self._scopes.reset(token)
