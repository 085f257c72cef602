/*
 * mma_ptx.cl: the inline-PTX building blocks of the NVIDIA tensor-core kernels
 * (flash_fwd_mma.cl, flash_bwd_mma.cl). The host compiles it first in the same
 * program ("mma_ptx.cl+flash_fwd_mma.cl"), so both kernel files use one copy.
 *
 * Everything here sits behind `#if USE_PTX`; with USE_PTX=0 (the default) the
 * file is empty OpenCL C and builds anywhere.
 *
 * Layout conventions shared by the kernels:
 *   - Local-memory rows are 16-byte chunks (8 fp16/bf16), swizzled so that
 *     ldmatrix (8 rows, same logical chunk) is conflict-free: with CH chunks per
 *     row, chunk c of row r sits at c ^ (r & 7) (CH >= 8).
 *   - mma.sync m16n8k16: A 16x16 row-major fragment a[4], B 16x8 "col" fragment
 *     {b0, b1}, C/D 16x8 fp32 c[4]: lane (g = lane / 4, t = lane % 4) holds
 *     c[0..1] = C[g][2t..2t+1] and c[2..3] = C[g+8][2t..2t+1]. The accumulators
 *     of n-tiles 2j, 2j+1 of one product are, packed to 16 bits, the A fragment of
 *     k-step j of the next product (P V, dS K, ...).
 *
 * Parameters (-D):
 *   USE_PTX   1: define the helpers; 0: empty file
 *   DTYPE     1 = fp16, 2 = bf16: the mma input type (accumulation is fp32)
 */
#ifndef USE_PTX
#define USE_PTX 0
#endif
#ifndef DTYPE
#define DTYPE 1
#endif

#if USE_PTX

#if DTYPE == 2
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif

/* Shared-state-space address of a __local pointer. */
#define SADDR(p) ((uint)(size_t)(p))
/* Byte offset of logical chunk c of row r in a swizzled tile of SWZ_ROW 16-byte
 * chunks per row (a multiple of 8, defined by the kernel file before any use). */
#define SWZ(r, c) ((uint)(((r) * SWZ_ROW + ((c) ^ ((r) & 7))) * 16))

inline void cp_async16(uint saddr, __global const ushort *src, uint bytes) {
  /* bytes = 0 zero-fills the 16 bytes (rows past the end of the sequence). */
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(src), "r"(bytes));
}
inline void cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
inline void cp_wait_all(void) { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
/* Waits until at most n (an immediate) of this work-item's newest commit groups
 * are pending. The memory clobber also keeps the compiler from moving a read of
 * a buffer below the copy that refills it. */
#define CP_WAIT_(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")
#define CP_WAIT(n) CP_WAIT_(n)

#define LDSM_X4(r0, r1, r2, r3, addr)                                             \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"    \
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)                          \
               : "r"(addr))
#define LDSM_X4_T(r0, r1, r2, r3, addr)                                                \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"   \
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)                               \
               : "r"(addr))
#define LDSM_X2_T(r0, r1, addr)                                                  \
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"   \
               : "=r"(r0), "=r"(r1)                                             \
               : "r"(addr))
/* c[0..3] += A(16x16, row) * B(16x8, col) */
#define MMA(c, a, b0, b1)                                                                                  \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE                                      \
      ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                         \
      : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                                           \
      : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1))

inline float shfl_xor(float x, int mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(mask));
  return r;
}
/* Bit l set iff p is non-zero in lane l. */
inline uint warp_ballot(int p) {
  uint r;
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.s32 q, %1, 0;\n\tvote.sync.ballot.b32 %0, q, 0xffffffff;\n\t}"
               : "=r"(r)
               : "r"(p));
  return r;
}
/* 1 in every lane if p is non-zero in any lane of the warp. Its own vote.any
 * rather than warp_ballot(p) != 0: the forward's lazy rescale calls it per tile,
 * and the ballot form was slower on the H100 (BENCHMARKS.md). */
inline int warp_any(int p) {
  int r;
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.s32 q, %1, 0;\n\tvote.sync.any.pred q, q, 0xffffffff;\n\tselp.s32 %0, 1, 0, q;\n\t}"
               : "=r"(r)
               : "r"(p));
  return r;
}
inline float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
/* tanh x = 1 - 2 / (e^2x + 1): one ex2 and one reciprocal (both approximate to
 * a few ulp; an IEEE division slowed the whole forward down), with the
 * limits +-1 exact (e^2x overflows to inf or underflows to 0). Absolute error
 * ~1e-7 near 0, where the score is small anyway (the logit softcap). */
inline float tanh_ex2(float x) { return 1.0f - 2.0f * native_recip(fast_exp2(x * 2.8853900817779268f) + 1.0f); }
/* Two floats to a packed pair of the mma type: lo in bits 0-15. */
inline uint pack2(float lo, float hi) {
  uint r;
#if DTYPE == 2
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}
/* Fire-and-forget fp32 atomic add in global memory (OpenCL 1.2 has none). */
inline void red_add_f32(__global float *p, float x) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(x) : "memory");
}

#endif /* USE_PTX */
