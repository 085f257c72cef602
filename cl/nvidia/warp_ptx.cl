/*
 * warp_ptx.cl: the NVIDIA fast paths that the portable kernels can switch on,
 * each behind its own tuning parameter: warp shuffles (flash_fwd.cl FWD_SHFL,
 * flash_bwd.cl BWD_SHFL), vector float atomics (flash_bwd.cl NV_RED) and a
 * named barrier over part of a work-group (flash_bwd.cl BWD_NBAR). They are
 * inline PTX, which only NVIDIA's OpenCL compiler takes, so they live here and
 * not in the portable files: the host joins this file in front of a portable
 * kernel only on a device that passed the tensor-core probe
 * (src/nvidia/mma_probe.c), and the portable kernels build and run without it
 * everywhere else.
 *
 * Parameters (-D):
 *   WARP_PTX   1: the helpers (the host sets it where it joins the file);
 *              0: an empty file, so that the file builds alone anywhere
 *   NV_RED     1: also the vector reduction (sm_90), the kernel's own switch
 */
#ifndef WARP_PTX_CL
#define WARP_PTX_CL

#ifndef WARP_PTX
#define WARP_PTX 0
#endif
#ifndef NV_RED
#define NV_RED 0
#endif

#if WARP_PTX

/* The value of lane ^ m (every lane of the warp calls it). */
inline float nv_shfl_xor(float x, int m) {
  float r;
  asm("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(m));
  return r;
}

/* The value of lane ^ 16, with the lane mask as an immediate. */
inline float nv_shfl_xor16(float x) {
  float r;
  asm("shfl.sync.bfly.b32 %0, %1, 16, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x));
  return r;
}

#if NV_RED
/* *p += v, four floats in one reduction: sm_90 and newer only, so it exists
 * only where the host asks for it (NV_RED, flash_bwd.cl). */
inline void nv_red_add4(__global float *p, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
#endif

/* Named barrier 1 over the first `nthreads` work-items that reach it (whole warps). */
inline void nv_bar_sync1(int nthreads) { asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory"); }

#endif /* WARP_PTX */

#endif /* WARP_PTX_CL */
