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
