"""The settings helper every package's config.py uses (kiln_shapes/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from kiln_shapes.settings import Settings, cache_key, parse_bool, setting


@dataclass(frozen=True)
class Config:
    verify: bool = setting("KILN_T_VERIFY", False, "check things")
    checks: bool = setting("KILN_T_CHECKS", True, "check more things", affects_cache=True)
    limit: int = setting("KILN_T_LIMIT", 8, "a count", affects_cache=True)
    ratio: float = setting("KILN_T_RATIO", 0.5, "a fraction")
    folder: str = setting("KILN_T_FOLDER", "", "a path")
    topics: frozenset[str] = setting("KILN_T_LOG", frozenset(), "comma-separated topics")
    cxx: str = setting("KILN_T_CXX", "g++", "a compiler", also=("KILN_T_CXX_FALLBACK",))
    mode: tuple[str, ...] = setting(
        "KILN_T_MODE", ("a",), "parsed by its own function", parse=lambda s: tuple(s.split("+"))
    )


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings[Config]:
    for name in ("VERIFY", "CHECKS", "LIMIT", "RATIO", "FOLDER", "LOG", "CXX", "CXX_FALLBACK"):
        monkeypatch.delenv(f"KILN_T_{name}", raising=False)
    return Settings("kiln-test", Config)


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", " on ", "oN\n"])
def test_bool_on(raw):
    assert parse_bool(raw) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "NO", " off "])
def test_bool_off(raw):
    assert parse_bool(raw) is False


@pytest.mark.parametrize("raw", ["2", "enabled", "y", "-1"])
def test_bool_rejects_other_words_naming_the_variable(settings, monkeypatch, raw):
    monkeypatch.setenv("KILN_T_VERIFY", raw)
    with pytest.raises(ValueError) as e:
        _ = settings.verify
    assert "KILN_T_VERIFY" in str(e.value) and repr(raw) in str(e.value)
    assert "1/true/yes/on" in str(e.value) and "0/false/no/off" in str(e.value)


def test_parsed_by_the_defaults_type(settings, monkeypatch):
    assert settings.current() == Config()
    for name, raw in [
        ("LIMIT", "3"),
        ("RATIO", "0.25"),
        ("FOLDER", "/tmp/x y"),
        ("LOG", " a, b,,"),
    ]:
        monkeypatch.setenv(f"KILN_T_{name}", raw)
    monkeypatch.setenv("KILN_T_MODE", "x+y")
    assert (settings.limit, settings.ratio, settings.folder) == (3, 0.25, "/tmp/x y")
    assert settings.topics == frozenset({"a", "b"}) and settings.mode == ("x", "y")
    monkeypatch.setenv("KILN_T_LIMIT", "many")
    with pytest.raises(ValueError, match="KILN_T_LIMIT='many'"):
        _ = settings.limit


def test_blank_means_the_default_and_fallback_variables(settings, monkeypatch):
    monkeypatch.setenv("KILN_T_CHECKS", "  ")
    assert settings.checks is True
    monkeypatch.setenv("KILN_T_CXX_FALLBACK", "clang++")
    assert settings.cxx == "clang++"
    monkeypatch.setenv("KILN_T_CXX", "g++-13")
    assert settings.cxx == "g++-13"


def test_read_per_call_not_at_creation(settings, monkeypatch):
    assert settings.verify is False
    monkeypatch.setenv("KILN_T_VERIFY", "1")
    assert settings.verify is True and settings.current().verify is True
    monkeypatch.setenv("KILN_T_VERIFY", "off")
    assert settings.verify is False
    assert settings.read({"KILN_T_VERIFY": "yes"}).verify is True  # another mapping


def test_scopes_nest_and_restore(settings, monkeypatch):
    monkeypatch.setenv("KILN_T_LIMIT", "5")
    with settings.scope(limit=1, verify=True) as outer:
        assert outer.limit == 1 and settings.verify is True
        with settings.scope(limit=2) as inner:
            assert inner.limit == 2 and inner.verify is True  # the outer scope still holds
            assert settings.read().limit == 5  # read() is the environment alone
        assert settings.limit == 1
    assert settings.limit == 5 and settings.verify is False


def test_scope_restored_on_exception(settings):
    with pytest.raises(RuntimeError, match="boom"):
        with settings.scope(limit=1):
            with settings.scope(limit=2):
                raise RuntimeError("boom")
    assert settings.limit == 8


def test_unknown_names_are_refused(settings):
    with pytest.raises(TypeError, match=r"unknown kiln-test settings: \['limt'\]"):
        with settings.scope(limt=1):
            pass
    with pytest.raises(AttributeError, match="no setting 'limt'"):
        _ = settings.limt


def test_assignment_overrides_until_deleted(settings, monkeypatch):
    settings.limit = 3
    monkeypatch.setenv("KILN_T_LIMIT", "4")
    assert settings.limit == 3
    with settings.scope(limit=2):
        assert settings.limit == 2  # a scope is innermost
    del settings.limit
    assert settings.limit == 4
    settings.verify = True
    settings.verify = False  # the environment's value: the override is gone
    monkeypatch.setenv("KILN_T_VERIFY", "1")
    assert settings.verify is True


def test_monkeypatch_setattr_is_undone(settings, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(settings, "limit", 1)
        assert settings.limit == 1
    monkeypatch.setenv("KILN_T_LIMIT", "6")
    assert settings.limit == 6


def test_cache_key_names_the_settings_that_change_output(settings, monkeypatch):
    monkeypatch.setenv("KILN_T_LIMIT", "3")
    assert cache_key(settings.current()) == "checks=True;limit=3"
    assert settings.declared["limit"].env == "KILN_T_LIMIT"
    assert all(s.help for s in settings.declared.values())
