"""Math helpers that generated kernels call as ``libm.<name>``.

On a GPU they are libdevice's functions (correctly rounded or nearly so, as eager CUDA
kernels are). Triton's interpreter cannot call libdevice, so under ``TRITON_INTERPRET=1``
the same names are Triton functions built from ``tl`` primitives: accurate to float32
tolerances on the ranges the tests use, which is what CPU CI checks. ``asin``, ``acos``,
``atan``, ``atan2`` and ``lgamma`` have no interpreter form; kernels using them run on GPUs
only (the GPU tests cover them).

The combine functions (``prod_combine``, ``max_nan``, ``min_nan``, ``welford_combine``) are the
same everywhere.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def prod_combine(a, b):
    return a * b


@triton.jit
def max_nan(a, b):
    # NaN wins, as in eager max/amax (nested selects, not `|`: Triton's interpreter has no
    # bitwise or of the 0-d booleans a 0-d reduction combines)
    return tl.where(a != a, a, tl.where(a > b, a, b))


@triton.jit
def min_nan(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


@triton.jit
def welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # two partial (mean, sum of squared deviations, count) merged (Chan et al.)
    n = n_a + n_b
    frac = tl.where(n == 0, 0.0, n_b / n)
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n


@triton.jit
def isinf(x):
    return tl.abs(x) == float("inf")


@triton.jit
def floordiv_int(a, b):
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) != (b < 0))
    return q - fix.to(q.dtype)


@triton.jit
def remainder_int(a, b):
    r = a % b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)


@triton.jit
def remainder_float(a, b):
    r = a % b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)


@triton.jit
def ipow(a, b):
    result = a * 0 + 1
    base = a + result * 0
    e = b + result * 0
    for _ in tl.static_range(63):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    return result


@triton.jit
def _copysign_formula(a, b):
    neg = (b < 0) | ((b == 0) & ((1 / b) < 0))
    return tl.where(neg, -tl.abs(a), tl.abs(a))


if INTERPRETING:

    @triton.jit
    def tanh(x):
        return 1 - 2 / (tl.exp(2 * x) + 1)

    @triton.jit
    def expm1(x):
        return tl.exp(x) - 1

    @triton.jit
    def log1p(x):
        return tl.log(1 + x)

    @triton.jit
    def log10(x):
        return tl.log(x) * 0.4342944819032518

    @triton.jit
    def tan(x):
        return tl.sin(x) / tl.cos(x)

    @triton.jit
    def sinh(x):
        return (tl.exp(x) - tl.exp(-x)) * 0.5

    @triton.jit
    def cosh(x):
        return (tl.exp(x) + tl.exp(-x)) * 0.5

    @triton.jit
    def asinh(x):
        ax = tl.abs(x)
        r = tl.log(ax + tl.sqrt(ax * ax + 1))
        return tl.where(x < 0, -r, r)

    @triton.jit
    def acosh(x):
        return tl.log(x + tl.sqrt(x * x - 1))

    @triton.jit
    def atanh(x):
        return 0.5 * tl.log((1 + x) / (1 - x))

    @triton.jit
    def erfc(x):
        return 1 - tl.erf(x)

    @triton.jit
    def trunc(x):
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))

    @triton.jit
    def nearbyint(x):
        f = tl.floor(x)
        d = x - f
        odd = (f % 2) != 0
        return tl.where(d > 0.5, f + 1, tl.where(d < 0.5, f, tl.where(odd, f + 1, f)))

    @triton.jit
    def hypot(a, b):
        return tl.sqrt(a * a + b * b)

    @triton.jit
    def copysign(a, b):
        return _copysign_formula(a, b)

    @triton.jit
    def pow(a, b):
        r = tl.exp(b * tl.log(tl.abs(a)))
        bi = b.to(tl.int64)
        is_int = bi.to(b.dtype) == b
        odd = tl.where(is_int, (bi % 2) != 0, False)
        r = tl.where(a < 0, tl.where(odd, -r, tl.where(is_int, r, float("nan"))), r)
        r = tl.where(a == 0, tl.where(b > 0, 0.0, tl.where(b == 0, 1.0, float("inf"))), r)
        return tl.where(b == 0, 1.0, r)

    def _gpu_only(name: str):  # pragma: no cover - raises inside the interpreter
        from triton.language.extra import libdevice

        return getattr(libdevice, name)

    asin = _gpu_only("asin")
    acos = _gpu_only("acos")
    atan = _gpu_only("atan")
    atan2 = _gpu_only("atan2")
    lgamma = _gpu_only("lgamma")
else:
    # jit wrappers: Triton maps libdevice to the CUDA/HIP implementation only where a
    # kernel's own globals name the libdevice module
    from triton.language.extra import libdevice

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def log10(x):
        return libdevice.log10(x)

    @triton.jit
    def tan(x):
        return libdevice.tan(x)

    @triton.jit
    def sinh(x):
        return libdevice.sinh(x)

    @triton.jit
    def cosh(x):
        return libdevice.cosh(x)

    @triton.jit
    def asinh(x):
        return libdevice.asinh(x)

    @triton.jit
    def acosh(x):
        return libdevice.acosh(x)

    @triton.jit
    def atanh(x):
        return libdevice.atanh(x)

    @triton.jit
    def erfc(x):
        return libdevice.erfc(x)

    @triton.jit
    def trunc(x):
        return libdevice.trunc(x)

    @triton.jit
    def nearbyint(x):
        return libdevice.nearbyint(x)

    @triton.jit
    def asin(x):
        return libdevice.asin(x)

    @triton.jit
    def acos(x):
        return libdevice.acos(x)

    @triton.jit
    def atan(x):
        return libdevice.atan(x)

    @triton.jit
    def lgamma(x):
        return libdevice.lgamma(x)

    @triton.jit
    def hypot(a, b):
        return libdevice.hypot(a, b)

    @triton.jit
    def copysign(a, b):
        return libdevice.copysign(a, b)

    @triton.jit
    def pow(a, b):
        return libdevice.pow(a, b)

    @triton.jit
    def atan2(a, b):
        return libdevice.atan2(a, b)
