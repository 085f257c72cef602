/*
 * sink_grad.cl: the gradient of the attention sinks (flashcl_attention_desc.
 * sinks, dsinks). A sink is one more softmax entry of logit sink[h] with no
 * value, so its probability in row i is exp(sink[h] - LSE_i) and, like every
 * entry's, its gradient is P * (dP - D_i) with dP = 0 (no value):
 *   dsinks[h] = -sum over the rows i of head h of exp(sink[h] - LSE_i) * D_i,
 *   D_i = rowsum(dO_i * O_i).
 * It needs only the forward's O and LSE and the incoming dO, so every kernel
 * family's backward shares it. One work-group per query head walks all rows of
 * all sequences; the sum is reduced in a fixed order (bit-reproducible).
 *
 * Parameters (-D): DTYPE (dtype.cl), HEAD_DIM, VARLEN (seq_bounds.cl), WG
 * (work-items per work-group, a power of two).
 *
 * requires: dtype.cl seq_bounds.cl
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef WG
#define WG 64
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void sink_grad(
    __global const store_t *o, long o_off, long o_sb, long o_sn, long o_sh,
    __global const store_t *dout, long d_off, long d_sb, long d_sn, long d_sh,
    __global const float *lse, long l_off, long l_sb, long l_sn, long l_sh, __global const float *sinks,
    __global float *dsinks, int batch, int padded, __global const int *cu, int total) {
  __local float red[WG];
  const int h = get_group_id(0), lid = get_local_id(0);
  const float sink = sinks[h];
  float acc = 0.0f;
  for (int s = 0; s < batch; s++) {
    const int2 rows = fcl_seq_rows(cu, s, padded, total);
    const long bb = VARLEN ? 0 : s;
    for (int i = lid; i < rows.y; i += WG) {
      const long n = rows.x + i;
      const long ob = o_off + bb * o_sb + n * o_sn + (long)h * o_sh, db = d_off + bb * d_sb + n * d_sn + (long)h * d_sh;
      float d = 0.0f;
      for (int x = 0; x < HEAD_DIM; x++) d = mad(LOAD(o, ob + x), LOAD(dout, db + x), d);
      const float l = lse[l_off + bb * l_sb + n * l_sn + (long)h * l_sh];
      if (l != -INFINITY) acc -= exp(sink - l) * d;
    }
  }
  red[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = WG / 2; w > 0; w >>= 1) {
    if (lid < w) red[lid] += red[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) dsinks[h] = red[0];
}
