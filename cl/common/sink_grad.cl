/*
 * sink_grad.cl: the gradient of the attention sinks (flashcl_attention_desc.
 * sinks, dsinks). A sink is one more softmax entry of logit sink[h] with no
 * value, so its probability in row i is exp(sink[h] - LSE_i) and, like every
 * entry's, its gradient is P * (dP - D_i) with dP = 0 (no value):
 *   dsinks[h] = -sum over the rows i of head h of exp(sink[h] - LSE_i) * D_i,
 *   D_i = rowsum(dO_i * O_i).
 * It needs only the forward's O and LSE and the incoming dO, so every kernel
 * family's backward shares it. Two steps, both in a fixed order (so the result
 * is bit-reproducible): sink_grad_part, PARTS work-groups per query head, each
 * summing a fixed share of the rows into part[h][x];
 * sink_grad_sum, one work-group per head, adding the PARTS partial sums.
 *
 * Parameters (-D): DTYPE (dtype.cl), HEAD_DIM (the head dim of o and dO, which
 * is v's: the host passes desc.shape.head_dim_v where it is set), VARLEN
 * (seq_bounds.cl), WG (work-items per work-group, a power of two).
 *
 * requires: dtype.cl seq_bounds.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef WG
#define WG 64
#endif

/* Sum of red[0 .. WG) into red[0]; every work-item calls it. */
inline void sink_reduce(__local float *red, int lid) {
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = WG / 2; w > 0; w >>= 1) {
    if (lid < w) red[lid] += red[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

/* Global (PARTS * WG, heads_q), local (WG, 1): work-group x of head h takes
 * the (sequence, row) pairs x, x + PARTS, ... of the batch * padded pairs; rows
 * past a sequence's length count nothing. The work-items of the group read one
 * row together (consecutive elements: whole cache lines), and each adds its
 * share of D_i times the row's weight: the sum over the rows and the elements
 * needs one reduction at the end, not one per row. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void sink_grad_part(
    __global const store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global const store_t *dout, long d_off, long d_sb, long d_sn, long d_sh,
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh, __global const float *sinks,
    __global float *part, int batch, int padded, __global const int *cu, int total) {
  __local float red[WG];
  const int x = get_group_id(0), parts = get_num_groups(0), h = get_group_id(1), lid = get_local_id(0);
  const float sink = sinks[h];
  const long pairs = (long)batch * padded;
  float acc = 0.0f;
  for (long pr = x; pr < pairs; pr += parts) {
    const int s = (int)(pr / padded), i = (int)(pr - (pr / padded) * padded);
    const int2 rows = fcl_seq_rows(cu, s, padded, total);
    if (i >= rows.y) continue; /* the same for the whole work-group */
    const long bb = VARLEN ? 0 : s, n = rows.x + i;
    /* No branch on the LSE before the row's loads: they all go out at once. */
    const float l = lse[l_off + bb * l_sb + n * l_sn + (long)h * l_sh];
    const long ob = o_off + bb * o_sb + n * o_sn + (long)h * o_sh, db = d_off + bb * d_sb + n * d_sn + (long)h * d_sh;
    float d = 0.0f;
    for (int e = lid; e < HEAD_DIM; e += WG) d = mad(LOAD(o, ob + e), LOAD(dout, db + e), d);
    acc -= (l == -INFINITY ? 0.0f : exp(sink - l)) * d;
  }
  red[lid] = acc;
  sink_reduce(red, lid);
  if (lid == 0) part[(long)h * parts + x] = red[0];
}

/* Global (WG, heads_q), local (WG, 1): dsinks[h] = the sum of head h's parts. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void sink_grad_sum(__global const float *part, int parts,
                                                                            __global float *dsinks) {
  __local float red[WG];
  const int h = get_group_id(1), lid = get_local_id(0);
  float acc = 0.0f;
  for (int x = lid; x < parts; x += WG) acc += part[(long)h * parts + x];
  red[lid] = acc;
  sink_reduce(red, lid);
  if (lid == 0) dsinks[h] = red[0];
}
