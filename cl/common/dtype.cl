/*
 * dtype.cl: the storage types of the caller's tensors and their conversion to
 * and from fp32, in which every kernel computes. The host joins it in front of
 * each kernel file that declares "requires: dtype.cl" (e.g. "dtype.cl+decode.cl"),
 * so that fp16 and bf16 are rounded the same way by every kernel.
 *
 * Without cl_khr_fp16, half is only a storage type: fp16 goes through
 * vload_half / vstore_half_rte. bf16 is kept as its ushort bits, so that it needs
 * no extension at all: widening is a shift, narrowing rounds to nearest even.
 *
 * On element index i of a store_t pointer p (aligned to one element only):
 *   LOAD(p, i), STORE(p, i, x)     one element as a float;
 *   LOAD4(p, i), STORE4(p, i, x)   four consecutive elements as a float4.
 * raw_t is an unsigned integer as wide as store_t, for bit-exact copies.
 *
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16).
 */
#ifndef DTYPE_CL
#define DTYPE_CL

#ifndef DTYPE
#define DTYPE 0
#endif

/* Round to nearest even. A NaN keeps its sign and top payload bits and gets the
 * quiet bit, because the rounding add could carry its payload into infinity. */
inline ushort fcl_bf16_from_float(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
inline float4 fcl_bf16x4_to_float4(ushort4 u) { return as_float4(convert_uint4(u) << 16); }
inline ushort4 fcl_bf16x4_from_float4(float4 f) {
  return (ushort4)(fcl_bf16_from_float(f.x), fcl_bf16_from_float(f.y), fcl_bf16_from_float(f.z),
                   fcl_bf16_from_float(f.w));
}
/* Four fp16 values packed in 64 bits, as kernels stage them in registers: the
 * conversion goes through private memory, the only place a half pointer may
 * point to bits that were not loaded from a half buffer. */
inline float4 fcl_half4_bits_to_float4(uint2 x) {
  uint2 t = x;
  return vload_half4(0, (const __private half *)&t);
}

#if DTYPE == 0
typedef float store_t;
typedef uint raw_t;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#define LOAD4(p, i) vload4(0, (p) + (i))
#define STORE4(p, i, x) vstore4((x), 0, (p) + (i))
#elif DTYPE == 1
typedef half store_t;
typedef ushort raw_t;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#define STORE4(p, i, x) vstore_half4_rte((x), 0, (p) + (i))
#else
typedef ushort store_t;
typedef ushort raw_t;
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#define STORE(p, i, x) ((p)[i] = fcl_bf16_from_float(x))
#define LOAD4(p, i) fcl_bf16x4_to_float4(vload4(0, (p) + (i)))
#define STORE4(p, i, x) vstore4(fcl_bf16x4_from_float4(x), 0, (p) + (i))
#endif

#endif
