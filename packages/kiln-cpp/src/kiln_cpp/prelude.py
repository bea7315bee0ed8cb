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
    r"""#include <cstdint>
#include <type_traits>
extern "C" {
"""
    + _decls()
    + r"""
}
// <cmath>, <limits> and <algorithm> cost most of a small kernel's compile time: the few
// functions kernels need, on GCC builtins
namespace kiln {
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> static constexpr T inf() { return T(__builtin_inf()); }
template <typename T> static constexpr T nan() { return T(__builtin_nan("")); }
template <typename T> static constexpr T maxval() {
  if constexpr (std::is_floating_point_v<T>) return inf<T>();
  else if constexpr (std::is_same_v<T, bool>) return true;
  else if constexpr (std::is_signed_v<T>) return T((1ULL << (sizeof(T) * 8 - 1)) - 1);
  else return T(~T(0));
}
template <typename T> static constexpr T lowest() {
  if constexpr (std::is_floating_point_v<T>) return -inf<T>();
  else if constexpr (std::is_same_v<T, bool>) return false;
  else if constexpr (std::is_signed_v<T>) return T(-maxval<T>() - 1);
  else return T(0);
}
#define KILN_UNARY(name) \
  static inline float name(float x) { return __builtin_##name##f(x); } \
  static inline double name(double x) { return __builtin_##name(x); }
KILN_UNARY(floor) KILN_UNARY(ceil) KILN_UNARY(trunc) KILN_UNARY(nearbyint) KILN_UNARY(sqrt)
KILN_UNARY(fabs) KILN_UNARY(lgamma)
#define KILN_BINARY(name) \
  static inline float name(float a, float b) { return __builtin_##name##f(a, b); } \
  static inline double name(double a, double b) { return __builtin_##name(a, b); }
KILN_BINARY(fmod) KILN_BINARY(copysign)
static inline bool isinf(float x) { return __builtin_isinf(x); }
static inline bool isinf(double x) { return __builtin_isinf(x); }
}
template <typename T> static inline bool kiln_isnan(T x) { if constexpr (std::is_floating_point_v<T>) return x != x; else return false; }
template <typename T> static inline T kiln_max(T a, T b) { return (a > b || kiln_isnan(a)) ? a : b; }
template <typename T> static inline T kiln_min(T a, T b) { return (a < b || kiln_isnan(a)) ? a : b; }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b == 0) return a / b;
    T mod = kiln::fmod(a, b); T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
    T fl = kiln::floor(div); if (div - fl > T(0.5)) fl += 1;
    return div == 0 ? kiln::copysign(T(0), a / b) : fl;
  } else {
    T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q;
  }
}
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = kiln::fmod(a, b); if (r != 0 && ((b < 0) != (r < 0))) r += b; return r;
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
// exp for float, inlined so that GCC vectorizes it in place (libmvec's expf is a call that
// clobbers every vector register; in softmax's sum loop this is ~15% faster per row).
// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (Cody-Waite, two parts),
// exp(r) by a degree-7 polynomial (Cephes' coefficients); max error ~1 ulp. 2^n is added to
// the exponent bits, in two steps below the normal range (subnormal results), NaN
// propagates (its n converts to INT_MIN, shifted out), +-inf and overflow/underflow by
// selects.
static inline float kiln_expf(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = __builtin_fmaf(x, 1.44269504088896341f, magic) - magic;
  float r = __builtin_fmaf(n, -0.693145751953125f, x);
  r = __builtin_fmaf(n, -1.428606765330187045e-06f, r);
  float p = 1.9875691500E-4f;
  p = __builtin_fmaf(p, r, 1.3981999507E-3f);
  p = __builtin_fmaf(p, r, 8.3334519073E-3f);
  p = __builtin_fmaf(p, r, 4.1665795894E-2f);
  p = __builtin_fmaf(p, r, 1.6666665459E-1f);
  p = __builtin_fmaf(p, r, 5.0000001201E-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  const bool sub = n < -125.0f;
  const int32_t ni = static_cast<int32_t>(n) + (sub ? 64 : 0);
  int32_t bits; __builtin_memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(static_cast<uint32_t>(ni) << 23);
  float res; __builtin_memcpy(&res, &bits, 4);
  res = res * (sub ? 5.42101086242752217e-20f : 1.0f);  // 2^-64
  res = x < -104.0f ? 0.0f : res;
  return x > 88.72283935546875f ? __builtin_inff() : res;
}
static inline float kiln_bf16_to_f32(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t kiln_f32_to_bf16(float f) {
  if (f != f) return 0x7fc0;
  uint32_t u; __builtin_memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
static inline float kiln_round_bf16(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }
static inline float kiln_f16_to_f32(uint16_t h) { _Float16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t kiln_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; __builtin_memcpy(&h, &x, 2); return h; }
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
// a row computed in a stack buffer, written with non-temporal stores (no read for ownership,
// no cache pollution) when a kernel writes more than the cache holds
static inline void kiln_stream_f32(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  typedef float v8 __attribute__((vector_size(32), aligned(4)));
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31); ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8) __builtin_ia32_movntps256(dst + i, *reinterpret_cast<const v8*>(src + i));
  __builtin_ia32_sfence();
#elif defined(__SSE__)
  typedef float v4 __attribute__((vector_size(16), aligned(4)));
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15); ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) __builtin_ia32_movntps(dst + i, *reinterpret_cast<const v4*>(src + i));
  __builtin_ia32_sfence();
#endif
  for (; i < n; ++i) dst[i] = src[i];
}
// index checks (kiln_inductor.index_check): the first failing lane's check number goes to
// the kernel's kiln_err (returned to the wrapper), its bad index to this library's slot
static int64_t kiln_bad_index = 0;
__attribute__((noinline, cold)) static void kiln_index_fail(int64_t* err, int64_t code, int64_t index) {
  int64_t none = 0;
  if (__atomic_compare_exchange_n(err, &none, code, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    __atomic_store_n(&kiln_bad_index, index, __ATOMIC_RELAXED);
}
extern "C" int64_t kiln_error_index(void) { return __atomic_load_n(&kiln_bad_index, __ATOMIC_RELAXED); }
"""
)
