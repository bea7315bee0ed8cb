import importlib.metadata

import kiln_cpp


def test_version_is_the_installed_distribution_version():
    assert kiln_cpp.__version__ == importlib.metadata.version("kiln-cpp")
    assert kiln_cpp.__version__.startswith("0.1.")
