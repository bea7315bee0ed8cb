import pytest
import torch

from kiln_aot import config


def test_read_config_parses_environment():
    cfg = config.read_config(
        {
            "KILN_AOT_DECOMPOSE_DROPOUT": "1",
            "KILN_AOT_RECOMPUTE_REDUCTION_NUMEL": "7",
            "KILN_LOG": "graphs, partition",
        }
    )
    assert cfg.decompose_dropout is True
    assert cfg.recompute_reduction_numel == 7
    assert cfg.log == frozenset({"graphs", "partition"})


def test_defaults_and_scoped_override():
    assert config.read_config({}) == config.AotConfig()
    before = config.current()
    with config.override(decompose_dropout=True) as cfg:
        assert cfg.decompose_dropout and config.current().decompose_dropout
    assert config.current() == before


def test_every_setting_is_documented():
    for name, setting in config.SETTINGS.items():
        assert setting.env.startswith("KILN_") and setting.help
        assert name in config.AotConfig.__dataclass_fields__ or name == "log"


def test_environment_set_after_import_is_honoured(compiler, monkeypatch, tmp_path):
    # kiln.compile(options={"debug_dir": ...}) sets KILN_DEBUG_DIR around one compilation,
    # long after kiln_aot was imported: the settings are read when used, not at import
    from kiln_aot import aot_function

    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_AOT_RECOMPUTE_REDUCTION_NUMEL", "7")
    assert config.current().debug_dir == str(tmp_path) and config.config.debug_dir
    assert config.current().recompute_reduction_numel == 7
    with torch.no_grad():
        aot_function(lambda x: x.sin() + 1, compiler)(torch.randn(4))
    assert [p.name for p in tmp_path.rglob("*.py")] == ["aot.inference.py"]


def test_a_bad_boolean_names_the_variable(monkeypatch):
    monkeypatch.setenv("KILN_AOT_FUSED_ATTENTION", "maybe")
    with pytest.raises(ValueError, match="KILN_AOT_FUSED_ATTENTION='maybe'"):
        config.current()
