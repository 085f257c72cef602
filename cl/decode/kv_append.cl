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
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16; storage only), HEAD_DIM (multiple of 4), PAGED.
 *
 * requires: dtype.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef PAGED
#define PAGED 0
#endif

__kernel void kv_append(__global const raw_t *kn, long kn_off, long kn_sb, long kn_sn, long kn_sh,
                        __global const raw_t *vn, long vn_off, long vn_sb, long vn_sn, long vn_sh,
                        __global raw_t *kc, long kc_off, long kc_sb, long kc_sn, long kc_sh,
                        __global raw_t *vc, long vc_off, long vc_sb, long vc_sn, long vc_sh,
                        __global const int *seqlens, __global const int *block_table, int max_pages, int page_size,
                        int num_pages, int capacity, int heads_kv) {
  const int g = get_global_id(0);
  const int th = get_global_id(1), b = get_global_id(2);
  const int t = th / heads_kv, h = th - (th / heads_kv) * heads_kv;
  const long pos = (long)seqlens[b] + t;
  if (pos < 0 || pos >= capacity) return;
#if PAGED
  const int pe = block_table[(long)b * max_pages + (int)(pos / page_size)];
  if (pe < 0 || pe >= num_pages) return;
  const long page = pe, slot = pos % page_size;
#else
  const long page = b, slot = pos;
#endif
  vstore4(vload4(0, kn + kn_off + b * kn_sb + t * kn_sn + h * kn_sh + 4 * g), 0,
          kc + kc_off + page * kc_sb + slot * kc_sn + h * kc_sh + 4 * g);
  vstore4(vload4(0, vn + vn_off + b * vn_sb + t * vn_sn + h * vn_sh + 4 * g), 0,
          vc + vc_off + page * vc_sb + slot * vc_sn + h * vc_sh + 4 * g);
}
