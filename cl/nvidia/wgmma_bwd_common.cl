/*
 * wgmma_bwd_common.cl: what the two Hopper dK/dV kernels share
 * (flash_bwd_wgmma.cl up to d = 128, flash_bwd_wgmma_wide.cl past it), joined
 * in front of each by the host (src/nvidia/wgmma_backward.c).
 *
 * Mostly macros, not functions: they read and write the kernels' own
 * variables (the arguments of bwd_dkdv_mma's list, the step's tile geometry
 * hk, group, qsteps, qstart, and the registers pl, pd), so that both kernels
 * keep one copy of these rules.
 *
 * Parameters (-D): MASK and VEC_RED, as in the kernels.
 */
#ifndef WGMMA_BWD_COMMON_CL
#define WGMMA_BWD_COMMON_CL

#ifndef MASK
#define MASK 0
#endif
#ifndef VEC_RED
#define VEC_RED 0
#endif

/* The mask row of (sequence b, query head h) and its class for sv_pair_visible:
 * 1 = test every bit (3, the mask's "all set", when there is no mask). */
#if MASK
#define MASK_ROW(h) (mask + b * mask_bs + (long)(h) * mask_hs)
#define MASK_CLASS 1
#else
#define MASK_ROW(h) mask
#define MASK_CLASS 3
#endif

/* Work-item r < BLOCK_R reads row r's LSE (log2 domain; +inf for a row without
 * keys or past nq, so that P = 0) and D of step s into registers pl, pd;
 * STORE_LD puts them in local memory a step later, so that the loads' latency
 * hides under the step's products. */
#define LOAD_LD(s)                                                                                          \
  {                                                                                                         \
    const int h_ = hk * group + (s) / qsteps, r_ = qstart + ((s) % qsteps) * BLOCK_R + tid;                 \
    pl = INFINITY;                                                                                          \
    pd = 0.0f;                                                                                              \
    if (tid < BLOCK_R && r_ < nq) {                                                                         \
      pl = lse[l_off + bq * l_sb + (row_q + r_) * l_sn + (long)h_ * l_sh];                                  \
      pd = dsum[((long)b * heads_q + h_) * seqlen_q + r_];                                                  \
    }                                                                                                       \
  }
#define STORE_LD(slot)                                                                                      \
  if (tid < BLOCK_R) {                                                                                      \
    l2s_all[(slot) * BLOCK_R + tid] = pl == -INFINITY ? INFINITY : pl * LOG2E;                              \
    dss_all[(slot) * BLOCK_R + tid] = pd;                                                                   \
  }

#ifdef MMA_TYPE /* mma_ptx.cl with USE_PTX=1: red_add_f32 */
/* dst[0], dst[1] += a, b in the fp32 dQ accumulator: one red.global.add.v2
 * (sm_90) with VEC_RED, else two scalar ones. */
inline void wg_red2(__global float *dst, float a, float b) {
#if VEC_RED
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  red_add_f32(dst, a);
  red_add_f32(dst + 1, b);
#endif
}
#endif

#endif /* WGMMA_BWD_COMMON_CL */
