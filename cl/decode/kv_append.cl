/*
 * kv_append.cl: flashcl_kv_cache_append. Copies k_new[b, t] and v_new[b, t]
 * (bit-exact, same dtype) to position pos = seqlens[b] + t of sequence b in the
 * cache. Contiguous cache: row pos of batch entry b. Paged (PAGED = 1): slot
 * pos % page_size of page block_table[b * max_pages + pos / page_size]. Positions
 * outside [0, capacity) and page indices outside [0, num_pages) are skipped, so a
 * corrupt length or table never writes outside the cache.
 * Global (HEAD_DIM / 4, T * heads_kv, batch): one work-item per four elements of
 * K and of V. Offsets and strides in elements.
 *
 *
 * kv_append_quant: the same positions, for a cache with a quantized side
 *   (K_DTYPE or V_DTYPE one of kv_quant.cl's formats; the other side, if plain,
 *   is copied as above). Global (2, T * heads_kv, batch): work-item (0, ...)
 *   writes the K row, (1, ...) the V row, all HEAD_DIM elements, since a TOKEN
 *   scale needs the row's absmax first: scale = absmax / kvq_qmax (fp32),
 *   written at the row's index of kv_quant.cl's layout (rows_per_page =
 *   page_size, or capacity when contiguous); BLOCK32 scales likewise per
 *   32-element block. TENSOR and HEAD scales are read.
 *   The codes are kvq_encode(x, scale).
 *
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16; storage only: the new
 * tokens' dtype), HEAD_DIM (multiple of 4), HEAD_DIM_V (v's, <= HEAD_DIM;
 * default HEAD_DIM), PAGED, K_DTYPE, V_DTYPE (the caches:
 * DTYPE or KVQ_I8 / KVQ_E4M3 / KVQ_E5M2 / KVQ_I4), K_SCALE, V_SCALE (KVQ_SCALE_* layouts).
 *
 * requires: dtype.cl kv_quant.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef PAGED
#define PAGED 0
#endif
/* K_DTYPE, V_DTYPE, K_SCALE, V_SCALE: defaults in kv_quant.cl. */
#if HEAD_DIM_V > HEAD_DIM || (HEAD_DIM % 32 && K_SCALE == KVQ_SCALE_BLOCK32) || \
    (HEAD_DIM_V % 32 && V_SCALE == KVQ_SCALE_BLOCK32)
#error "BLOCK32 scales need a head dim that is a multiple of 32"
#endif

/* The cache page and slot of new token t of sequence b; 0 when the token is
 * skipped (a position outside [0, capacity), or a page index outside the pool). */
inline int kv_target(__global const int *seqlens, __global const int *block_table, int b, int t, int max_pages,
                     int page_size, int num_pages, int capacity, long *page, long *slot) {
  const long pos = (long)seqlens[b] + t;
  if (pos < 0 || pos >= capacity) return 0;
#if PAGED
  const int pe = block_table[(long)b * max_pages + (int)(pos / page_size)];
  if (pe < 0 || pe >= num_pages) return 0;
  *page = pe, *slot = pos % page_size;
#else
  (void)block_table, (void)max_pages, (void)page_size, (void)num_pages;
  *page = b, *slot = pos;
#endif
  return 1;
}

__kernel void kv_append(__global const raw_t *kn, long kn_off, long kn_sb, long kn_sn, long kn_sh,
                        __global const raw_t *vn, long vn_off, long vn_sb, long vn_sn, long vn_sh,
                        __global raw_t *kc, long kc_off, long kc_sb, long kc_sn, long kc_sh,
                        __global raw_t *vc, long vc_off, long vc_sb, long vc_sn, long vc_sh,
                        __global const int *seqlens, __global const int *block_table, int max_pages, int page_size,
                        int num_pages, int capacity, int heads_kv) {
  const int g = get_global_id(0);
  const int th = get_global_id(1), b = get_global_id(2);
  const int t = th / heads_kv, h = th - (th / heads_kv) * heads_kv;
  long page, slot;
  if (!kv_target(seqlens, block_table, b, t, max_pages, page_size, num_pages, capacity, &page, &slot)) return;
  vstore4(vload4(0, kn + kn_off + b * kn_sb + t * kn_sn + h * kn_sh + 4 * g), 0,
          kc + kc_off + page * kc_sb + slot * kc_sn + h * kc_sh + 4 * g);
  if (4 * g < HEAD_DIM_V) /* V's row may be shorter (HEAD_DIM_V <= HEAD_DIM) */
    vstore4(vload4(0, vn + vn_off + b * vn_sb + t * vn_sn + h * vn_sh + 4 * g), 0,
            vc + vc_off + page * vc_sb + slot * vc_sn + h * vc_sh + 4 * g);
}

/* One row of d new values src[0..d) into cache row dst (element index, bytes
 * for a quantized format, d / 2 of them for KVQ_I4) of format fmt; scale_at:
 * this row's slot of the scale buffer. */
inline void kv_append_row(__global const store_t *src, __global uchar *cache, long dst, int d, int fmt, int kind,
                          __global float *scales, long scale_at) {
  if (fmt == DTYPE) {
    __global raw_t *c = (__global raw_t *)cache;
    __global const raw_t *s = (__global const raw_t *)src;
    for (int x = 0; x < d; x++) c[dst + x] = s[x];
    return;
  }
  /* TOKEN: one block of the whole row; BLOCK32: blocks of 32, each with the
   * scale that follows the previous one's (scale_at is block 0's). */
  const int bw = kind == KVQ_SCALE_BLOCK32 ? 32 : d;
  for (int x0 = 0; x0 < d; x0 += bw) {
    float scale;
    if (KVQ_ROW_KIND(kind)) {
      /* fmax drops NaN, so a NaN element does not take the whole block with it. */
      float amax = 0.0f;
      for (int x = x0; x < x0 + bw; x++) amax = fmax(amax, fabs(LOAD(src, x)));
      scale = amax / kvq_qmax(fmt);
      scales[scale_at + x0 / bw] = scale;
    } else {
      scale = scales[scale_at];
    }
    if (fmt == KVQ_I4) /* two codes per byte, the even element low */
      for (int x = x0; x < x0 + bw; x += 2)
        cache[dst + x / 2] =
            (uchar)(kvq_encode(LOAD(src, x), scale, fmt) | (kvq_encode(LOAD(src, x + 1), scale, fmt) << 4));
    else
      for (int x = x0; x < x0 + bw; x++) cache[dst + x] = kvq_encode(LOAD(src, x), scale, fmt);
  }
}

__kernel void kv_append_quant(__global const store_t *kn, long kn_off, long kn_sb, long kn_sn, long kn_sh,
                              __global const store_t *vn, long vn_off, long vn_sb, long vn_sn, long vn_sh,
                              __global uchar *kc, long kc_off, long kc_sb, long kc_sn, long kc_sh,
                              __global uchar *vc, long vc_off, long vc_sb, long vc_sn, long vc_sh,
                              __global const int *seqlens, __global const int *block_table, int max_pages,
                              int page_size, int num_pages, int capacity, int heads_kv, __global float *k_scale,
                              __global float *v_scale) {
  const int side = get_global_id(0);
  const int th = get_global_id(1), b = get_global_id(2);
  const int t = th / heads_kv, h = th - (th / heads_kv) * heads_kv;
  long page, slot;
  if (!kv_target(seqlens, block_table, b, t, max_pages, page_size, num_pages, capacity, &page, &slot)) return;
  const long row = page * (PAGED ? page_size : capacity) + slot; /* the TOKEN scales' row */
  if (side == 0)
    kv_append_row(kn + kn_off + b * kn_sb + t * kn_sn + h * kn_sh, kc, kc_off + page * kc_sb + slot * kc_sn + h * kc_sh,
                  HEAD_DIM, K_DTYPE, K_SCALE, k_scale, kvq_scale_index(K_SCALE, row, heads_kv, h, HEAD_DIM, 0));
  else
    kv_append_row(vn + vn_off + b * vn_sb + t * vn_sn + h * vn_sh, vc, vc_off + page * vc_sb + slot * vc_sn + h * vc_sh,
                  HEAD_DIM_V, V_DTYPE, V_SCALE, v_scale, kvq_scale_index(V_SCALE, row, heads_kv, h, HEAD_DIM_V, 0));
}
