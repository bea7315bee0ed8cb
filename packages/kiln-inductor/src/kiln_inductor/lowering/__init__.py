"""ATen → IR lowerings, one module per op family; importing this package registers them."""

from . import extern, norm, pointwise, pooling, reduction, scan, scatter, tensors, views  # noqa: F401
from .registry import EXTERN_OPS, FALLBACK_OPS, LOWERINGS

__all__ = ["EXTERN_OPS", "FALLBACK_OPS", "LOWERINGS"]
