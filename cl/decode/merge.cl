/*
 * merge.cl: flashcl_merge_states, the associative merge of two partial attention
 * results (o_a, lse_a) and (o_b, lse_b) over disjoint key sets:
 *   m = max(lse_a, lse_b), w_x = exp(lse_x - m),
 *   o = (w_a o_a + w_b o_b) / (w_a + w_b),  lse = m + log(w_a + w_b).
 * A side with lse = -inf gets weight 0 (the other side passes through, its LSE
 * bit-exact); both -inf give o = 0 and lse = -inf, never NaN.
 *
 * Work-group = one row (b, n, h): HEAD_DIM / 4 work-items, one float4 column
 * granule each. Every work-item reads the row's two LSEs before the barrier and
 * only work-item 0 writes the LSE after it, so lse may be the same view as lse_a
 * or lse_b (and o the same view as o_a or o_b) for an in-place merge.
 * Global (HEAD_DIM / 4, seqlen, batch * heads). Offsets and strides in elements.
 *
 * Parameters (-D): DTYPE (0 = fp32, 1 = fp16, 2 = bf16; storage only), HEAD_DIM (multiple of 4).
 *
 * requires: dtype.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D4 (HEAD_DIM / 4)

__kernel __attribute__((reqd_work_group_size(D4, 1, 1))) void merge_states(
    __global const store_t *oa, long oa_off, long oa_sb, long oa_sn, long oa_sh,
    __global const float *la, long la_off, long la_sb, long la_sn, long la_sh,
    __global const store_t *ob, long ob_off, long ob_sb, long ob_sn, long ob_sh,
    __global const float *lb, long lb_off, long lb_sb, long lb_sn, long lb_sh,
    __global store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global float *l, long l_off, long l_sb, long l_sn, long l_sh, int has_lse, int heads) {
  const int g = get_local_id(0);
  const long n = get_group_id(1);
  const int bh = get_group_id(2);
  const long b = bh / heads, h = bh - (bh / heads) * heads;

  const float lsa = la[la_off + b * la_sb + n * la_sn + h * la_sh];
  const float lsb = lb[lb_off + b * lb_sb + n * lb_sn + h * lb_sh];
  const float m = fmax(lsa, lsb);
  float wa = 0.0f, wb = 0.0f, out_lse = -INFINITY;
  if (m != -INFINITY) {
    wa = exp(lsa - m); /* exp(-inf) = 0 */
    wb = exp(lsb - m);
    /* One side empty: its LSE passes through unchanged. */
    out_lse = lsa == -INFINITY ? lsb : lsb == -INFINITY ? lsa : m + log(wa + wb);
  }
  const float inv = m != -INFINITY ? 1.0f / (wa + wb) : 0.0f;
  float4 acc = (float4)(0.0f);
  /* Never read a side whose weight is 0: its O may be anything (even NaN). */
  if (wa > 0.0f) acc = wa * LOAD4(oa, oa_off + b * oa_sb + n * oa_sn + h * oa_sh + 4 * g);
  if (wb > 0.0f) acc += wb * LOAD4(ob, ob_off + b * ob_sb + n * ob_sn + h * ob_sh + 4 * g);
  barrier(CLK_GLOBAL_MEM_FENCE); /* every work-item has read the LSEs */
  STORE4(o, o_off + b * o_sb + n * o_sn + h * o_sh + 4 * g, acc * inv);
  if (has_lse && g == 0) l[l_off + b * l_sb + n * l_sn + h * l_sh] = out_lse;
}
