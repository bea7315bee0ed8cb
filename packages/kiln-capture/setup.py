"""Build of kiln_capture._C, the CPython extension that will hold the PEP 523 frame hook.

Metadata lives in pyproject.toml; this file only declares the extension, because
setuptools has no declarative form for C++ extensions built with pybind11.
"""

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "kiln_capture._C",
            ["src/kiln_capture/csrc/module.cpp"],
            cxx_std=17,
        )
    ],
)
