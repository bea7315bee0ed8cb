import importlib.metadata

import kiln_aot


def test_version_is_the_installed_distribution_version():
    assert kiln_aot.__version__ == importlib.metadata.version("kiln-aot")
    assert kiln_aot.__version__.startswith("0.1.")
