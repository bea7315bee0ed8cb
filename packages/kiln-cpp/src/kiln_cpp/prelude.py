"""The C++ text every kernel starts with: headers, vectorizable math declarations, helpers.

glibc's libmvec provides SIMD versions of the math functions; declaring them with
``__attribute__((simd))`` lets GCC vectorize loops that call them without -ffast-math
(which would break NaN/inf semantics). The helpers give PyTorch's semantics where C++
differs: NaN-propagating max/min, Python-style floor division and remainder,
round-to-nearest-even bfloat16.
"""

from __future__ import annotations

SIMD_MATH_FLOAT = "expf exp2f expm1f logf log2f log10f log1pf sinf cosf tanf asinf acosf atanf sinhf coshf tanhf asinhf acoshf atanhf erff erfcf".split()
SIMD_MATH_DOUBLE = "exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh erf erfc".split()
SIMD_MATH_BINARY = ("powf", "pow", "atan2f", "atan2", "hypotf", "hypot")


def _decls() -> str:
    lines = []
    for f in SIMD_MATH_FLOAT:
        lines.append(f'__attribute__((simd("notinbranch"))) float {f}(float) noexcept;')
    for f in SIMD_MATH_DOUBLE:
        lines.append(f'__attribute__((simd("notinbranch"))) double {f}(double) noexcept;')
    for f in SIMD_MATH_BINARY:
        t = "float" if f.endswith("f") else "double"
        lines.append(f'__attribute__((simd("notinbranch"))) {t} {f}({t}, {t}) noexcept;')
    return "\n".join(lines)


PRELUDE = (
    r"""#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
extern "C" {
"""
    + _decls()
    + r"""
}
template <typename T> static inline bool kiln_isnan(T x) { if constexpr (std::is_floating_point_v<T>) return x != x; else return false; }
template <typename T> static inline T kiln_max(T a, T b) { return (a > b || kiln_isnan(a)) ? a : b; }
template <typename T> static inline T kiln_min(T a, T b) { return (a < b || kiln_isnan(a)) ? a : b; }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b); T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
    T fl = std::floor(div); if (div - fl > T(0.5)) fl += 1;
    return div == 0 ? std::copysign(T(0), a / b) : fl;
  } else {
    T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q;
  }
}
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = std::fmod(a, b); if (r != 0 && ((b < 0) != (r < 0))) r += b; return r;
  } else {
    T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;
  }
}
template <typename T> static inline T kiln_ipow(T a, T b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b % 2) ? -1 : 1) : 0);
  T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
template <typename T> static inline T kiln_sign(T x) {
  if constexpr (std::is_floating_point_v<T>) { if (x != x) return x; }
  return static_cast<T>((T(0) < x) - (x < T(0)));
}
static inline float kiln_bf16_to_f32(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t kiln_f32_to_bf16(float f) {
  if (f != f) return 0x7fc0;
  uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
static inline float kiln_round_bf16(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }
static inline float kiln_f16_to_f32(uint16_t h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t kiln_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; std::memcpy(&h, &x, 2); return h; }
static inline float kiln_round_f16(float f) { return (float)(_Float16)f; }
template <typename T> static inline void kiln_welford_merge(T& mean, T& m2, int64_t& n, T bmean, T bm2, int64_t bn) {
  if (bn == 0) return;
  int64_t tot = n + bn; T delta = bmean - mean; T w = T(bn) / T(tot);
  mean = mean + delta * w; m2 = m2 + bm2 + delta * delta * T(n) * w; n = tot;
}
template <typename T> static inline bool kiln_arg_better(bool is_max, T v, int64_t i, T av, int64_t ai) {
  if (kiln_isnan(av)) return kiln_isnan(v) && i < ai;
  if (kiln_isnan(v)) return true;
  if (v == av) return i < ai;
  return is_max ? (v > av) : (v < av);
}
"""
)
