import importlib.metadata

import kiln_inductor


def test_version_is_the_installed_distribution_version():
    assert kiln_inductor.__version__ == importlib.metadata.version("kiln-inductor")
    assert kiln_inductor.__version__.startswith("0.1.")
