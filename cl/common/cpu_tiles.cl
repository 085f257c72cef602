/*
 * cpu_tiles.cl: the tile loops that the CPU kernels (cl/portable/
 * flash_fwd_cpu.cl, cl/decode/decode_cpu.cl) share, in explicit float8
 * vectors (one AVX register): one row's online softmax step over a tile of
 * scores, and O += P V over a register block of rows. One work-item owns all
 * its rows there, so these are plain loops; PoCL's vectorizer does not widen
 * code that already uses vector types, hence the explicit vectors, and the
 * register blocks' loops are unrolled so that their accumulators stay in
 * registers (BENCHMARKS.md, "the decode's CPU kernel").
 *
 * Parameters (-D): HEAD_DIM_V and BLOCK_C, the kernels' own (multiples of 8).
 */
#ifndef CPU_TILES_CL
#define CPU_TILES_CL

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef BLOCK_C
#define BLOCK_C 32
#endif

#define CPU_VW 8                                        /* float8 */
#define CPU_RB 4                                        /* rows per register block */
#define CPU_CV (BLOCK_C / CPU_VW)                       /* key vectors of a score row */
#define CPU_DV (HEAD_DIM_V / CPU_VW)                    /* vectors of an O or V row */
#define CPU_DB (CPU_DV % 4 == 0 ? 4 : CPU_DV % 2 == 0 ? 2 : 1) /* O vectors per register block */

/* One row's online softmax step: srow (BLOCK_C log2-domain scores, -inf where
 * hidden) becomes exp2(s - pivot); *m and *l become the row's running max and
 * sum; orow (HEAD_DIM_V accumulators) is rescaled to the new pivot. */
inline void cpu_softmax_row(float *srow, float *m, float *l, float *orow) {
  float8 mv = vload8(0, srow);
  for (int c = 1; c < CPU_CV; c++) mv = fmax(mv, vload8(c, srow));
  const float4 m4 = fmax(mv.lo, mv.hi);
  const float mx = fmax(*m, fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w)));
  /* No visible key so far: pivot 0 keeps exp2(-inf - pivot) = 0, not NaN. */
  const float pivot = mx == -INFINITY ? 0.0f : mx;
  const float alpha = exp2(*m - pivot);
  *m = mx;
  float8 sv = (float8)(0.0f);
  for (int c = 0; c < CPU_CV; c++) {
    const float8 pv = exp2(vload8(c, srow) - (float8)(pivot));
    sv += pv;
    vstore8(pv, c, srow);
  }
  const float4 s4 = sv.lo + sv.hi;
  *l = *l * alpha + ((s4.x + s4.y) + (s4.z + s4.w));
  if (alpha != 1.0f)
    for (int c = 0; c < CPU_DV; c++) vstore8(vload8(c, orow) * alpha, c, orow);
}

/* O rows r0 .. r0 + CPU_RB - 1 += P V over the tile's first jn keys: Op rows
 * of HEAD_DIM_V, Sp rows of BLOCK_C probabilities, Vs rows of HEAD_DIM_V. */
inline void cpu_pv_block(float *Op, const float *Sp, __local const float *Vs, int r0, int jn) {
  for (int d0 = 0; d0 < CPU_DV; d0 += CPU_DB) {
    float8 a[CPU_RB][CPU_DB];
    #pragma unroll
    for (int i = 0; i < CPU_RB; i++)
      #pragma unroll
      for (int c = 0; c < CPU_DB; c++) a[i][c] = vload8(d0 + c, Op + (r0 + i) * HEAD_DIM_V);
    for (int j = 0; j < jn; j++) {
      float8 vv[CPU_DB];
      #pragma unroll
      for (int c = 0; c < CPU_DB; c++) vv[c] = vload8(d0 + c, Vs + j * HEAD_DIM_V);
      #pragma unroll
      for (int i = 0; i < CPU_RB; i++) {
        const float8 pv = (float8)(Sp[(r0 + i) * BLOCK_C + j]);
        #pragma unroll
        for (int c = 0; c < CPU_DB; c++) a[i][c] = fma(pv, vv[c], a[i][c]);
      }
    }
    #pragma unroll
    for (int i = 0; i < CPU_RB; i++)
      #pragma unroll
      for (int c = 0; c < CPU_DB; c++) vstore8(a[i][c], d0 + c, Op + (r0 + i) * HEAD_DIM_V);
  }
}

#endif
