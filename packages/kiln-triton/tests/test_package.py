import importlib.metadata

import kiln_triton


def test_version_is_the_installed_distribution_version():
    assert kiln_triton.__version__ == importlib.metadata.version("kiln-triton")
    assert kiln_triton.__version__.startswith("0.1.")
