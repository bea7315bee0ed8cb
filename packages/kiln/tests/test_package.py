import importlib.metadata

import kiln


def test_version_is_the_installed_distribution_version():
    assert kiln.__version__ == importlib.metadata.version("kiln")
    assert kiln.__version__.startswith("0.1.")
