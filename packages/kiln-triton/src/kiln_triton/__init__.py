"""Triton kernels for CUDA tensors, generated from kiln-inductor's fused IR; autotuning and
CUDA graphs.

Importing kiln_triton registers its backend for device type "cuda" with kiln-inductor.

    kiln_triton.compile_fx(gm, example_inputs, mode=None, options=None)
    torch.compile(fn, backend=kiln_triton.compile_fx)
"""

from importlib.metadata import version as _version

__version__: str = _version("kiln-triton")

from kiln_inductor import register_backend as _register_backend

from .backend import TritonBackend
from .compile import compile_fx
from .cudagraphs import CudaGraphRunner

_register_backend("cuda", TritonBackend())

__all__ = ["CudaGraphRunner", "TritonBackend", "__version__", "compile_fx"]
