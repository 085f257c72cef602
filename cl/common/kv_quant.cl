/*
 * kv_quant.cl: the quantized KV-cache formats (flashcl.h, "Quantized KV
 * cache"), written once for the kernel that fills a cache (kv_append.cl) and
 * the one that reads it (decode.cl), so that both agree on every bit. The
 * host joins it in front of each kernel file that declares
 * "requires: kv_quant.cl"; tests/reference_kvq.c is its host copy.
 *
 * Formats (the flashcl_dtype values, one byte per element but for KVQ_I4):
 *   KVQ_I8   (3) two's-complement int8;
 *   KVQ_E4M3 (4) fp8 S.EEEE.MMM, bias 7, subnormals, no inf, NaN S.1111.111,
 *                largest finite 448 (0x7e);
 *   KVQ_E5M2 (5) fp8 S.EEEEE.MM, bias 15 (binary16's top byte): subnormals,
 *                inf (E = 31, M = 0) and NaN, largest finite 57344 (0x7b);
 *   KVQ_I4   (6) two's-complement int4, two per byte (FLASHCL_I4X2): element
 *                2i of a row in the low nibble of the row's byte i, 2i + 1 in
 *                the high one. A cache of it counts bytes in its strides and
 *                last dimension (d / 2 of them per row), so the host's tensor
 *                machinery stays byte-sized; only the code index halves.
 * Decoding is integer bit manipulation into fp32 (no fp8 hardware, and no
 * fp32 subnormals, which some devices flush). A value is code * scale.
 *
 * Encoding of x with scale s: y = x / s in fp32; s == 0 gives code 0. I8
 * rounds y to nearest even and clamps to [-127, 127] (NaN: 0), I4 likewise
 * to [-7, 7] (symmetric, as I8: -8 decodes but is never written); fp8 rounds
 * |y| to the nearest representable magnitude, ties to even, and saturates at
 * the largest finite one (inf included), NaN keeps its sign and becomes the
 * format's NaN (E4M3 0x7f, E5M2 0x7e).
 *
 * Scale layouts (KVQ_SCALE_*, the flashcl_kv_scale values): TOKEN one per cache
 * row, HEAD one per kv head, TENSOR one float, BLOCK32 one per 32 consecutive
 * elements of a row (ggml's q8_0 blocks); TOKEN (row = page * rows_per_page +
 * slot, rows_per_page = page_size for a paged cache, max_len for a contiguous
 * one), dense over (row, kv head), and BLOCK32 dense over (row, kv head,
 * block).
 *
 * Parameters (-D) of the kernels that join this file, defaulted here once:
 * K_DTYPE, V_DTYPE (each cache's storage: DTYPE, the tokens' dtype from
 * dtype.cl, or KVQ_I8 / KVQ_E4M3 / KVQ_E5M2) and K_SCALE, V_SCALE (their
 * KVQ_SCALE_* layouts; ignored for a plain cache).
 */
#ifndef KV_QUANT_CL
#define KV_QUANT_CL

#define KVQ_I8 3
#define KVQ_E4M3 4
#define KVQ_E5M2 5
#define KVQ_I4 6
#define KVQ_SCALE_TOKEN 0
#define KVQ_SCALE_HEAD 1
#define KVQ_SCALE_TENSOR 2
#define KVQ_SCALE_BLOCK32 3

#ifndef K_DTYPE
#define K_DTYPE DTYPE
#endif
#ifndef V_DTYPE
#define V_DTYPE DTYPE
#endif
#ifndef K_SCALE
#define K_SCALE KVQ_SCALE_TOKEN
#endif
#ifndef V_SCALE
#define V_SCALE KVQ_SCALE_TOKEN
#endif

/* The largest code magnitude: TOKEN scales are absmax / kvq_qmax. */
inline float kvq_qmax(int fmt) {
  return fmt == KVQ_I8 ? 127.0f : fmt == KVQ_I4 ? 7.0f : fmt == KVQ_E4M3 ? 448.0f : 57344.0f;
}
/* Index steps per 8 elements of a row: 4 bytes for KVQ_I4, else 8 elements
 * (a byte of the other formats, or of a plain cache in its dtype). */
#define KVQ_BYTES8(fmt) ((fmt) == KVQ_I4 ? 4 : 8)

/* Index of the scale of element e of kv head h at cache row `row` (d elements
 * per row) in a scale buffer of this kind. */
inline long kvq_scale_index(int kind, long row, int heads_kv, int h, int d, int e) {
  if (kind == KVQ_SCALE_BLOCK32) return (row * heads_kv + h) * (d / 32) + e / 32;
  return kind == KVQ_SCALE_TENSOR ? 0 : kind == KVQ_SCALE_HEAD ? (long)h : row * heads_kv + h;
}
/* Scales that come with each cache row (TOKEN, BLOCK32) rather than once. */
#define KVQ_ROW_KIND(kind) ((kind) == KVQ_SCALE_TOKEN || (kind) == KVQ_SCALE_BLOCK32)

inline float8 kvq_e4m3x8_to_float8(uchar8 b) {
  const uint8 u = convert_uint8(b), em = u & 0x7fu;
  /* Normal: rebias the exponent (127 - 7) and widen the mantissa; subnormal:
   * M * 2^-9, exact in fp32. */
  const float8 norm = as_float8((((em >> 3) + 120u) << 23) | ((em & 7u) << 20));
  float8 mag = select(convert_float8(em) * 0.001953125f, norm, em >= (uint8)(8u));
  mag = select(mag, (float8)(NAN), em == (uint8)(0x7fu));
  return as_float8(as_uint8(mag) | ((u & 0x80u) << 24));
}

inline float8 kvq_e5m2x8_to_float8(uchar8 b) {
  const uint8 u = convert_uint8(b), em = u & 0x7fu, m = em & 3u;
  const float8 norm = as_float8((((em >> 2) + 112u) << 23) | (m << 21));
  float8 mag = select(convert_float8(m) * 0.0000152587890625f, norm, em >= (uint8)(4u));
  /* E = 31: inf, or a quiet NaN that keeps the mantissa as payload. */
  mag = select(mag, as_float8((uint8)(0x7f800000u) | select((uint8)(0u), (uint8)(0x00400000u) | (m << 21), m != 0u)),
               em >= (uint8)(0x7cu));
  return as_float8(as_uint8(mag) | ((u & 0x80u) << 24));
}

/* Eight int4 codes (four bytes, low nibble first) as fp32: (n ^ 8) - 8 is
 * nibble n as a two's-complement value. */
inline float8 kvq_i4x8_to_float8(uchar4 b) {
  const int4 w = convert_int4(b);
  const float4 lo = convert_float4(((w & 15) ^ 8) - 8), hi = convert_float4(((w >> 4) ^ 8) - 8);
  return (float8)(lo.s0, hi.s0, lo.s1, hi.s1, lo.s2, hi.s2, lo.s3, hi.s3);
}

/* Eight codes of format fmt as fp32 (not yet scaled); for KVQ_I4, b.lo holds
 * the four bytes of the eight codes. */
inline float8 kvq_decode8(uchar8 b, int fmt) {
  if (fmt == KVQ_I8) return convert_float8(as_char8(b));
  if (fmt == KVQ_I4) return kvq_i4x8_to_float8(b.lo);
  return fmt == KVQ_E4M3 ? kvq_e4m3x8_to_float8(b) : kvq_e5m2x8_to_float8(b);
}

/* fp8 code of y (M mantissa bits, exponent bias BIAS), see the top. */
inline uchar kvq_fp8_encode(float y, int fmt) {
  const int m = fmt == KVQ_E4M3 ? 3 : 2, bias = fmt == KVQ_E4M3 ? 7 : 15;
  const uint maxc = fmt == KVQ_E4M3 ? 0x7eu : 0x7bu, sign = (as_uint(y) >> 24) & 0x80u;
  const float a = fabs(y);
  if (isnan(a)) return (uchar)(sign | (fmt == KVQ_E4M3 ? 0x7fu : 0x7eu));
  uint c;
  if (a < (fmt == KVQ_E4M3 ? 0.015625f : 0.00006103515625f)) {
    /* Subnormal range: the code counts units of 2^(1 - bias - m); a power-of-two
     * scaling is exact, rint rounds half to even, and a carry to 2^m is the
     * smallest normal code, as it should be. */
    c = (uint)rint(a * (fmt == KVQ_E4M3 ? 512.0f : 65536.0f));
  } else {
    /* Round fp32's mantissa to m bits (half to even) in the integer bits; a
     * carry moves into the exponent. The bits past the mantissa are then
     * exponent and mantissa of the code, once rebiased. */
    const int sh = 23 - m;
    uint bits = as_uint(a);
    bits += (1u << (sh - 1)) - 1u + ((bits >> sh) & 1u);
    c = (bits >> sh) - ((uint)(127 - bias) << m);
  }
  return (uchar)(sign | min(c, maxc));
}

/* Four values of a quantized cache: elements e .. e + 3 (e a multiple of 4)
 * of kv head h's row `row` (d elements), scaled. i is where element e's code
 * would be at one byte per element (the row's start + e): the codes are at
 * p[i .. i + 3], or for KVQ_I4 in the two bytes from p[i - e / 2]. */
inline float4 kvq_load4(__global const uchar *p, long i, __global const float *scale, int fmt, int kind, long row,
                        int heads_kv, int h, int d, int e) {
  /* Element by element, not (uchar8)(b, (uchar4)(0)): see decode.cl's Q load. */
  uchar8 b8;
  if (fmt == KVQ_I4) {
    const uchar2 b = vload2(0, p + i - e / 2);
    b8 = (uchar8)(b.s0, b.s1, 0, 0, 0, 0, 0, 0);
  } else {
    const uchar4 b = vload4(0, p + i);
    b8 = (uchar8)(b.s0, b.s1, b.s2, b.s3, 0, 0, 0, 0);
  }
  return kvq_decode8(b8, fmt).lo * scale[kvq_scale_index(kind, row, heads_kv, h, d, e)];
}

/* The code of x under scale s in format fmt. */
inline uchar kvq_encode(float x, float s, int fmt) {
  if (s == 0.0f) return 0;
  const float y = x / s;
  if (fmt == KVQ_I8) return isnan(y) ? (uchar)0 : as_uchar((char)(int)clamp(rint(y), -127.0f, 127.0f));
  /* I4: the low nibble holds the code; the caller packs two per byte. */
  if (fmt == KVQ_I4) return isnan(y) ? (uchar)0 : (uchar)((int)clamp(rint(y), -7.0f, 7.0f) & 15);
  return kvq_fp8_encode(y, fmt);
}

#endif
