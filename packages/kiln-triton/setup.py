"""Build of kiln-triton's optional C extension (metadata lives in pyproject.toml; setuptools
has no declarative form for extensions).

``kiln_triton._launch``: cuLaunchKernel for kernels taking only tensors, with libcuda opened
on first use (no CUDA needed to build it). Optional: where it does not build, kernels
launch through Triton's own launcher.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kiln_triton._launch",
            ["src/kiln_triton/csrc/launch.c"],
            extra_compile_args=["-O2"],
            libraries=["dl"],
            optional=True,
        )
    ]
)
