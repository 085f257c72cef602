/*
 * split_merge.cl: the one-launch form of split-KV decode (MERGE_LAST = 1 in
 * decode.cl's decode_attn and decode_mma.cl): the split partials are merged
 * by the attention kernel's own work-groups, so a call pays one launch
 * instead of two (decode.cl's decode_merge is the two-kernel form).
 *
 * Workspace (decode.cl's layout): row id = (b * q_len + t) * heads_q + hq; split
 *   s's partial o (normalised, fp32) at wo[(id * S + s) * DV + x], its
 *   log2-domain LSE at wl[id * S + s], S = num_splits.
 *
 * A tree of two levels, so that no work-group merges many partials: the S
 *   splits of a row block form groups of G = ceil(sqrt(S)) consecutive splits
 *   (the last one shorter). Once a split's work-group has stored its partials
 *   it counts itself in on its group's counter; the group's last arrival
 *   merges the group's partials into the slot of the group's first split (the
 *   same format), then counts the group in on the block's counter, whose last
 *   arrival merges the groups' slots (every G-th) into o and lse. A work-group
 *   reads at most G partials per row at each level, with four loads in
 *   flight per work-item. One row block merged by one work-group with all S
 *   partials (66 at batch 1 on an H100) made a call 4-40% slower than the
 *   second kernel there; the tree 2-12% from 4K keys on (BENCHMARKS.md), so
 *   the default rule keeps two kernels (src/decode/decode_plan.c).
 *
 * Merge of count partials (log2 LSEs l_i, o_i): m = max l_i, w_i = exp2(l_i - m)
 *   (0 for l_i = -inf, whose o_i is never read), o = sum w_i o_i / sum w_i,
 *   l = m + log2(sum w_i); every l_i = -inf gives o = 0, l = -inf.
 *
 * Ordering. OpenCL 1.2 has no device-scope acquire or release, so the form
 *   leans on what GPU and CPU implementations give: each work-item fences its
 *   stores (mem_fence, and on NVIDIA membar.gl by inline PTX, SM_FENCE_PTX),
 *   the work-group meets at a barrier, and work-item 0
 *   takes a ticket with atomic_inc. The work-group that draws the last ticket
 *   sets the counter back to 0 (no other work-group touches it again in this
 *   launch, so the next launch finds it zero) and reads the partials through
 *   volatile pointers, which no cache line read before the other work-groups'
 *   stores can satisfy. No work-group waits for another: the form needs no
 *   forward-progress guarantee. The host zero-fills the counters once; every
 *   launch leaves them zero. Counters per row block: the groups', then the
 *   block's: ceil(S / G) + 1, blocks one after another.
 *
 * Local memory: SM_LOCAL_FLOATS(rows) floats (rows: the most rows of a
 *   block): the LSEs of one level, rows x SM_GROUP_MAX, and the arrival flag.
 *
 * Parameters (-D): MERGE_LAST (0 or 1), SM_FENCE_PTX (1 on NVIDIA: membar.gl
 *   by inline PTX as well; default USE_PTX). S is at most SM_GROUP_MAX^2 = 256
 *   (FLASHCL_DECODE_MAX_SPLITS).
 */
#ifndef SPLIT_MERGE_CL
#define SPLIT_MERGE_CL

#ifndef MERGE_LAST
#define MERGE_LAST 0
#endif
#ifndef USE_PTX
#define USE_PTX 0
#endif
/* NVIDIA's compiler makes mem_fence(CLK_GLOBAL_MEM_FENCE) a membar.cta, which
 * orders nothing for other multiprocessors: there the fence is membar.gl. */
#ifndef SM_FENCE_PTX
#define SM_FENCE_PTX USE_PTX
#endif

#define SM_GROUP_MAX 16
#define SM_LOCAL_FLOATS(rows) ((rows) * SM_GROUP_MAX + 1)

/* Partials written by other work-groups of this launch. The workspace is
 * the context's scratch at offset 0, so float4 reads are aligned. */
#define SM_LOAD4(p) (*(volatile __global const float4 *)(p))

/* G for S splits: the least G with G * G >= S. */
inline int sm_group(int S) {
  int g = 1;
  while (g * g < S) g++;
  return g;
}

/* Row rg of a row block of sequence b, KV head hk: its workspace id, token and query head. */
inline long sm_row(int b, int q_len, int heads_q, int hk, int group, int rg, int *t, int *hq) {
  const int gi = rg / q_len;
  *t = rg - gi * q_len;
  *hq = hk * group + gi;
  return ((long)b * q_len + *t) * heads_q + *hq;
}

inline void sm_fence(void) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);
#if SM_FENCE_PTX
  __asm__ volatile("membar.gl;" ::: "memory");
#endif
}

/* 1 in every work-item of the work-group that takes the last of `total`
 * tickets of counter c (and resets it). */
inline int sm_arrive(__global uint *c, int total, __local int *flag) {
  sm_fence();
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  if (get_local_id(0) == 0) {
    const int last = atomic_inc(c) == (uint)(total - 1);
    if (last) atomic_xchg(c, 0u);
    *flag = last;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const int last = *flag;
  if (last) sm_fence();
  barrier(CLK_LOCAL_MEM_FENCE); /* flag is free again */
  return last;
}

/* The log2 LSEs of partials first, first + stride, ... (count of them) of
 * rows [row0, row0 + nr) into W[r * SM_GROUP_MAX + i]. Ends with a barrier. */
inline void sm_gather(__global const float *work, long wl_off, int S, int b, int q_len, int heads_q, int hk,
                      int group, int row0, int nr, int first, int stride, int count, __local float *W) {
  const int n = get_local_size(0);
  for (int e = get_local_id(0); e < nr * count; e += n) {
    const int r = e / count, i = e - r * count;
    int t, hq;
    const long id = sm_row(b, q_len, heads_q, hk, group, row0 + r, &t, &hq);
    W[r * SM_GROUP_MAX + i] = ((volatile __global const float *)work)[wl_off + id * S + first + i * stride];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}

/* Granule g (4 elements) of one row's merge over the gathered LSEs Wr; wo is
 * the row's split 0. Returns o's granule, *l2 the log2 LSE. */
inline float4 sm_merge4(__global const float *wo, __local const float *Wr, int first, int stride, int count,
                        int dv4, int g, float *l2) {
  float m = -INFINITY;
  for (int i = 0; i < count; i++) m = fmax(m, Wr[i]);
  float sum = 0.0f;
  float4 acc = (float4)(0.0f);
  for (int i0 = 0; i0 < count; i0 += 4) {
    float4 p[4];
    #pragma unroll
    for (int u = 0; u < 4; u++) /* the loads first: four in flight */
      p[u] = i0 + u < count && Wr[i0 + u] != -INFINITY
                 ? SM_LOAD4(wo + (long)(first + (i0 + u) * stride) * 4 * dv4 + 4 * g)
                 : (float4)(0.0f);
    #pragma unroll
    for (int u = 0; u < 4; u++) {
      const float l = i0 + u < count ? Wr[i0 + u] : -INFINITY;
      const float w = l == -INFINITY ? 0.0f : exp2(l - m);
      sum += w;
      acc = mad((float4)(w), p[u], acc);
    }
  }
  *l2 = sum > 0.0f ? m + log2(sum) : -INFINITY;
  return sum > 0.0f ? acc * (1.0f / sum) : (float4)(0.0f);
}

/* The one-launch tail of split `split`'s work-group, once its partials of
 * rows [row0, row0 + nr) are stored: the group level (if this work-group's
 * group is complete with it), then the block's arrival. Returns 1 in the
 * work-group that must merge the groups into o; W then holds their LSEs
 * (first 0, stride *G, *groups of them, for sm_merge4). */
inline int sm_tail(__global uint *counters, long block, int S, int split, __global float *work, long wo_off,
                   long wl_off, int dv4, int b, int q_len, int heads_q, int hk, int group, int row0, int nr,
                   __local float *loc, int *G, int *groups) {
  const int g = sm_group(S), ng = (S + g - 1) / g, j = split / g;
  const int first = j * g, count = min(g, S - first);
  __local int *flag = (__local int *)(loc + SM_LOCAL_FLOATS(nr) - 1);
  __global uint *c = counters + block * (ng + 1);
  *G = g;
  *groups = ng;
  if (count > 1) {
    if (!sm_arrive(c + j, count, flag)) return 0;
    sm_gather(work, wl_off, S, b, q_len, heads_q, hk, group, row0, nr, first, 1, count, loc);
    for (int e = get_local_id(0); e < nr * dv4; e += get_local_size(0)) {
      const int r = e / dv4, x = e - r * dv4;
      int t, hq;
      const long id = sm_row(b, q_len, heads_q, hk, group, row0 + r, &t, &hq);
      __global float *wo = work + wo_off + id * S * 4 * dv4;
      float l2;
      const float4 v = sm_merge4(wo, loc + r * SM_GROUP_MAX, first, 1, count, dv4, x, &l2);
      vstore4(v, 0, wo + (long)first * 4 * dv4 + 4 * x);
      if (x == 0) work[wl_off + id * S + first] = l2;
    }
  }
  if (!sm_arrive(c + ng, ng, flag)) return 0;
  sm_gather(work, wl_off, S, b, q_len, heads_q, hk, group, row0, nr, 0, g, ng, loc);
  return 1;
}

/* Item e = r * dv4 + x of the final merge, in the work-group sm_tail chose:
 * granule x of o's row row0 + r, with that row's token *t, query head *hq and
 * LSE *lse (natural log). The caller stores it in its dtype. */
inline float4 sm_final(int e, int dv4, __global const float *work, long wo_off, int S, int b, int q_len,
                       int heads_q, int hk, int group, int row0, __local const float *loc, int G, int groups, int *t,
                       int *hq, float *lse) {
  const int r = e / dv4;
  const long id = sm_row(b, q_len, heads_q, hk, group, row0 + r, t, hq);
  float l2;
  const float4 o4 = sm_merge4(work + wo_off + id * S * 4 * dv4, loc + r * SM_GROUP_MAX, 0, G, groups, dv4,
                              e - r * dv4, &l2);
  *lse = l2 * M_LN2_F;
  return o4;
}

#endif
