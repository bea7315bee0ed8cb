"""Build of kiln-capture's CPython extensions.

Metadata lives in pyproject.toml; this file only declares the extensions, because
setuptools has no declarative form for C++ extensions:

- ``kiln_capture._C`` (pybind11, no libtorch): the PEP 523 frame hook and the native
  attribute guards (``check_attrs``);
- ``kiln_capture._tensor_guards`` (pybind11 + libtorch, optional): all tensor guards of a
  cache entry in one call. Built only when torch is importable at build time (install
  with ``--no-build-isolation``); without it guards check tensors in Python.
"""

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup


def _tensor_guards():
    try:
        import torch
        from torch.utils.cpp_extension import CppExtension
    except ImportError:
        return []
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    ext = CppExtension(
        "kiln_capture._tensor_guards",
        ["src/kiln_capture/csrc/tensor_guards.cpp"],
        extra_compile_args=[
            "-std=c++17",
            "-O2",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f'-DKILN_BUILT_FOR_TORCH="{torch.__version__}"',
        ],
    )
    ext.runtime_library_dirs = list(ext.library_dirs)
    return [ext]


setup(
    ext_modules=[
        Pybind11Extension(
            "kiln_capture._C",
            ["src/kiln_capture/csrc/module.cpp", "src/kiln_capture/csrc/attr_guards.cpp"],
            cxx_std=17,
        ),
        *_tensor_guards(),
    ],
)
