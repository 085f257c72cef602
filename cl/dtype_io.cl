/*
 * dtype_io.cl: storage-type helpers shared by decode.cl, merge.cl and
 * kv_append.cl (prepended to them: "dtype_io.cl+decode.cl").
 *
 * Parameters (-D):
 *   DTYPE  0 = fp32, 1 = fp16, 2 = bf16. Storage only: math is fp32. fp16 goes
 *          through vload_half / vstore_half (no cl_khr_fp16 needed), bf16 through
 *          ushort shifts (round to nearest even, NaN stays NaN).
 * Provides store_t, raw_t (a bit-exact copy type of the same size),
 * LOAD4(p, i) -> float4 and STORE4(p, i, x) on element index i (any alignment).
 */
#ifndef DTYPE_IO_CL
#define DTYPE_IO_CL

#ifndef DTYPE
#define DTYPE 0
#endif

#if DTYPE == 0
typedef float store_t;
typedef uint raw_t;
#define LOAD4(p, i) vload4(0, (p) + (i))
#define STORE4(p, i, x) vstore4((x), 0, (p) + (i))
#elif DTYPE == 1
typedef half store_t;
typedef ushort raw_t;
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#define STORE4(p, i, x) vstore_half4_rte((x), 0, (p) + (i))
#else
typedef ushort store_t;
typedef ushort raw_t;
inline ushort fcl_bf16_from_float(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
#define LOAD4(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
inline ushort4 fcl_bf16x4_from_float4(float4 f) {
  return (ushort4)(fcl_bf16_from_float(f.x), fcl_bf16_from_float(f.y), fcl_bf16_from_float(f.z),
                   fcl_bf16_from_float(f.w));
}
#define STORE4(p, i, x) vstore4(fcl_bf16x4_from_float4(x), 0, (p) + (i))
#endif

#endif
