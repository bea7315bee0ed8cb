import importlib.metadata

import kiln_capture


def test_version_is_the_installed_distribution_version():
    assert kiln_capture.__version__ == importlib.metadata.version("kiln-capture")
    assert kiln_capture.__version__.startswith("0.1.")


def test_native_extension_matches_the_running_interpreter():
    import sys

    from kiln_capture import _C

    assert tuple(_C.built_for_python()) == sys.version_info[:2]
