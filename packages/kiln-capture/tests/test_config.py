"""Settings are read from the environment in one place."""

from kiln_capture import config as config_module


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("KILN_LOG", "graphs, breaks")
    monkeypatch.setenv("KILN_CACHE_SIZE_LIMIT", "3")
    cfg = config_module._read()
    assert cfg.log_topics == frozenset({"graphs", "breaks"})
    assert cfg.cache_size_limit == 3


def test_defaults(monkeypatch):
    monkeypatch.delenv("KILN_LOG", raising=False)
    monkeypatch.delenv("KILN_CACHE_SIZE_LIMIT", raising=False)
    cfg = config_module._read()
    assert cfg.cache_size_limit == 8 and cfg.log_topics == frozenset()
    assert all(s.help for s in config_module.SETTINGS.values())
