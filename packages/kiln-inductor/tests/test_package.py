import importlib.metadata

import kiln_inductor


def test_version_is_the_installed_distribution_version():
    assert kiln_inductor.__version__ == importlib.metadata.version("kiln-inductor")
    assert kiln_inductor.__version__.startswith("0.1.")


def test_warnings_print_under_kiln_log(monkeypatch, capsys):
    # KILN_LOG installs a handler whose format names the record's topic: a warning (which
    # has none of its own) printed "--- Logging error --- KeyError: 'topic'" instead
    import logging

    from kiln_inductor import log

    logger = logging.getLogger("kiln_inductor")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setenv("KILN_LOG", "kernels")
    log.log("kernels", "a kernel")
    log.warn_once("test-warning-under-kiln-log", "kiln: something ran eagerly")
    err = capsys.readouterr().err
    assert "[kiln:kernels] a kernel" in err
    assert "[kiln:warning] kiln: something ran eagerly" in err
    assert "Logging error" not in err
