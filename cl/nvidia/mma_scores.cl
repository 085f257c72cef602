/*
 * mma_scores.cl: what the tensor-core kernels (flash_fwd_mma.cl,
 * flash_bwd_mma.cl, flash_fwd_wgmma.cl) change in the shared score variants
 * of score_variant.cl: the softcap's tanh through one ex2 (mma_ptx.cl's
 * tanh_ex2) instead of the library tanh, whose slow path would dominate the
 * score loop of a tensor-core kernel. The host compiles it after mma_ptx.cl
 * and right before score_variant.cl.
 *
 * Parameters (-D), the kernel's own: USE_PTX.
 */
#ifndef MMA_SCORES_CL
#define MMA_SCORES_CL

#ifndef USE_PTX
#define USE_PTX 0
#endif

#if USE_PTX
#ifndef MMA_TYPE
#error "mma_scores.cl needs mma_ptx.cl compiled first in the same program"
#endif
#ifdef SCORE_VARIANT_CL
#error "mma_scores.cl must come before score_variant.cl"
#endif
#define SV_TANH(x) tanh_ex2(x)
#endif

#endif /* MMA_SCORES_CL */
