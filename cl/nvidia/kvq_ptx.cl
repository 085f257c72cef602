/*
 * kvq_ptx.cl: the codes of a quantized KV cache (kv_quant.cl's int8, e4m3,
 * e5m2 and int4) turned into fp32 or 16-bit values with PTX byte permutes and sm_89's
 * fp8 conversion, for the NVIDIA kernels that feed such a cache to the tensor
 * cores (decode_mma.cl, flash_fwd_mma.cl). kv_quant.cl's portable decoding
 * does the same with integer bit manipulation, several instructions per code;
 * these take one or two per pair of codes, which matters where a kernel turns
 * every code of a tile into a 16-bit element.
 *
 * The host joins it after mma_ptx.cl (pack2) and kv_quant.cl (the formats,
 * kvq_decode8): "mma_ptx.cl+kv_quant.cl+kvq_ptx.cl+...". With USE_PTX = 0 it
 * is empty, so it builds anywhere on its own.
 *
 * Parameters (-D): USE_PTX; DTYPE (1 = fp16, 2 = bf16: dmq_codes8's output);
 * CVT_E4M3 (1: the device has cvt.rn.f16x2.e4m3x2, compute capability >= 8.9;
 * the host sets it).
 */
#define KVQ_PTX_CL
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif
#ifndef CVT_E4M3
#define CVT_E4M3 0
#endif

#if USE_PTX
#if !defined(KV_QUANT_CL) || !defined(MMA_TYPE)
#error "kvq_ptx.cl needs mma_ptx.cl and kv_quant.cl compiled first in the same program"
#endif

/* Bytes of {b, a} (b the high word) picked by the selector's nibbles. */
inline uint dmq_prmt(uint a, uint b, uint sel) {
  uint r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
/* Code i of x = w ^ 0x80808080 as the fp32 bits of 2^23 + code + 128. */
#define DMQ_I8F(x, i) as_float(dmq_prmt((x), 0x4b000000u, 0x7540u + (i)))

/* Eight fp8 codes as exact fp16 values: e5m2 is binary16's top byte (byte
 * permutes); e4m3 through sm_89's conversion, NaN included. Only for formats
 * DMQ_FP8_FAST takes. */
#define DMQ_FP8_FAST(fmt) ((fmt) == KVQ_E5M2 || (CVT_E4M3 && (fmt) == KVQ_E4M3))
inline uint4 dmq_fp8_f16x8(uint2 w, int fmt) {
  if (fmt == KVQ_E5M2)
    return (uint4)(dmq_prmt(w.x, 0u, 0x1404u), dmq_prmt(w.x, 0u, 0x3424u), dmq_prmt(w.y, 0u, 0x1404u),
                   dmq_prmt(w.y, 0u, 0x3424u));
  uint4 h = (uint4)(0u);
#if CVT_E4M3
  asm("{.reg .b16 a, b;\n\tmov.b32 {a, b}, %4;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t"
      "mov.b32 {a, b}, %5;\n\tcvt.rn.f16x2.e4m3x2 %2, a;\n\tcvt.rn.f16x2.e4m3x2 %3, b;}"
      : "=r"(h.x), "=r"(h.y), "=r"(h.z), "=r"(h.w)
      : "r"(w.x), "r"(w.y));
#endif
  return h;
}
/* A packed pair of fp16 values as two floats (lo first). */
inline float2 dmq_f16x2_f32(uint h) {
  float2 f;
  asm("{.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;}"
      : "=f"(f.x), "=f"(f.y)
      : "r"(h));
  return f;
}

/* Eight int4 codes (one word, element order from the low nibble up) as eight
 * bytes of code + 8, in element order: dmq_decode8 and dmq_codes8 take
 * these for KVQ_I4 (flipping bit 3 of a nibble adds 8 to its two's-complement
 * value; the two permutes interleave the low and high nibbles). */
inline uint2 dmq_i4_bytes(uint w) {
  const uint x = w ^ 0x88888888u, lo = x & 0x0f0f0f0fu, hi = (x >> 4) & 0x0f0f0f0fu;
  return (uint2)(dmq_prmt(lo, hi, 0x5140u), dmq_prmt(lo, hi, 0x7362u));
}

/* Eight codes of format fmt in fp32, before the scale (KVQ_I4: w from
 * dmq_i4_bytes, through the same fp32 bits as int8 with its own offset). int8 goes through the
 * fp32 bits of 2^23 + (code + 128), less 2^23 + 128 (exact; the integer to
 * float conversion runs at a quarter of the fp32 rate), fp8 through exact
 * fp16 where DMQ_FP8_FAST, else as decode.cl does. */
inline float8 dmq_decode8(uint2 w, int fmt) {
  if (DMQ_FP8_FAST(fmt)) {
    const uint4 h = dmq_fp8_f16x8(w, fmt);
    const float2 a = dmq_f16x2_f32(h.x), b = dmq_f16x2_f32(h.y), c = dmq_f16x2_f32(h.z), d = dmq_f16x2_f32(h.w);
    return (float8)(a, b, c, d);
  }
  if (fmt == KVQ_I8) {
    const uint x = w.x ^ 0x80808080u, y = w.y ^ 0x80808080u;
    return (float8)(DMQ_I8F(x, 0), DMQ_I8F(x, 1), DMQ_I8F(x, 2), DMQ_I8F(x, 3), DMQ_I8F(y, 0), DMQ_I8F(y, 1),
                    DMQ_I8F(y, 2), DMQ_I8F(y, 3)) -
           8388736.0f;
  }
  if (fmt == KVQ_I4)
    return (float8)(DMQ_I8F(w.x, 0), DMQ_I8F(w.x, 1), DMQ_I8F(w.x, 2), DMQ_I8F(w.x, 3), DMQ_I8F(w.y, 0),
                    DMQ_I8F(w.y, 1), DMQ_I8F(w.y, 2), DMQ_I8F(w.y, 3)) -
           8388616.0f;
  return kvq_decode8(as_uchar8(w), fmt);
}

/* Two int8 codes (bytes sel picks of x = w ^ 0x80808080) as exact fp16 values:
 * 0x64XX is 1024 + XX, and XX is code + 128. */
inline uint dmq_i8x2_f16(uint x, uint sel) {
  uint r = dmq_prmt(x, 0x64646464u, sel);
  asm("sub.f16x2 %0, %0, %1;" : "+r"(r) : "r"(0x64806480u)); /* 1152, 1152 */
  return r;
}
/* Two int4 codes (bytes sel picks of x, each code + 8) as exact fp16 values. */
inline uint dmq_i4x2_f16(uint x, uint sel) {
  uint r = dmq_prmt(x, 0x64646464u, sel);
  asm("sub.f16x2 %0, %0, %1;" : "+r"(r) : "r"(0x64086408u)); /* 1032, 1032 */
  return r;
}
/* Eight codes as eight exact DTYPE values (no scale): into fp16 directly where
 * a fast conversion exists (int8 and int4 by byte permutes, DMQ_FP8_FAST),
 * else through fp32. KVQ_I4: w from dmq_i4_bytes. */
inline uint4 dmq_codes8(uint2 w, int fmt) {
#if DTYPE == 1
  if (fmt == KVQ_I8) {
    const uint x = w.x ^ 0x80808080u, y = w.y ^ 0x80808080u;
    return (uint4)(dmq_i8x2_f16(x, 0x4140u), dmq_i8x2_f16(x, 0x4342u), dmq_i8x2_f16(y, 0x4140u),
                   dmq_i8x2_f16(y, 0x4342u));
  }
  if (fmt == KVQ_I4)
    return (uint4)(dmq_i4x2_f16(w.x, 0x4140u), dmq_i4x2_f16(w.x, 0x4342u), dmq_i4x2_f16(w.y, 0x4140u),
                   dmq_i4x2_f16(w.y, 0x4342u));
  if (DMQ_FP8_FAST(fmt)) return dmq_fp8_f16x8(w, fmt);
#endif
  const float8 f = dmq_decode8(w, fmt);
  return (uint4)(pack2(f.s0, f.s1), pack2(f.s2, f.s3), pack2(f.s4, f.s5), pack2(f.s6, f.s7));
}
#endif /* USE_PTX */
