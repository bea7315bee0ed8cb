"""The facade: `kiln.compile`, a drop-in for `torch.compile` built on the kiln packages."""

from importlib.metadata import version as _version

__version__: str = _version("kiln")

__all__ = ["__version__"]
