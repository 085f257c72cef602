/*
 * split_merge.cl: the merge of split-KV decode partials into o and lse, shared
 * by its two forms:
 *   - decode_merge (decode.cl), a second kernel with one work-group per row;
 *   - the one-launch form (MERGE_LAST = 1) of decode_attn and decode_mma: once
 *     a split's work-group has stored its partials it counts itself in on its
 *     row block's counter, and the work-group that arrives last merges the
 *     block's rows. A batch-1 call then pays one launch instead of two.
 *
 * Workspace (decode.cl's layout): row id = (b * q_len + t) * heads_q + hq; split
 *   s's partial o (normalised, fp32) at wo[(id * num_splits + s) * DV + x], its
 *   log2-domain LSE at wl[id * num_splits + s].
 *
 * The merge of a row: m = max_s lse_s, w_s = exp2(lse_s - m) (0 for an empty
 *   split, whose o is 0), o = sum_s w_s o_s / sum_s w_s, lse = (m + log2 sum) ln 2;
 *   no visible key in any split gives o = 0 and lse = -inf. The n work-items
 *   spread the splits (tree reductions for m and the sum) and then, as msg
 *   split groups times DV / 4 granules, the weighted sums.
 *
 * Ordering in the one-launch form. OpenCL 1.2 has no device-scope acquire or
 *   release, so the form leans on what every GPU and CPU implementation gives:
 *   each work-item fences its partial stores (mem_fence; with USE_PTX also
 *   membar.gl, CUDA's __threadfence), the work-group meets at a barrier, and
 *   work-item 0 takes a ticket with atomic_inc. The work-group that draws
 *   num_splits - 1 sets the counter back to 0 (no other work-group of the
 *   block touches it again in this launch, so the next launch finds it zero)
 *   and reads the partials through volatile pointers, which no cache line read
 *   before the other work-groups' stores can satisfy. No work-group waits for
 *   another: the form needs no forward-progress guarantee. The counters start
 *   at zero (the host zero-fills them once) and every launch leaves them zero.
 *
 * Local memory of a merge (n work-items, DV4 = DV / 4 granules):
 *   SM_LOCAL_FLOATS(n, DV4) floats, 16-byte aligned: float4 Acc[max(n, DV4)],
 *   W[MERGE_MAX_SPLITS], Red[n], and the arrival flag.
 *
 * Parameters (-D): MERGE_LAST (0 or 1), MERGE_MAX_SPLITS (at least the split
 *   count), USE_PTX (1 on NVIDIA: the PTX fence as well).
 *
 * The caller stores the merged rows in its own dtype (sm_merge_row leaves
 * them in local memory), so this file needs no other.
 */
#ifndef SPLIT_MERGE_CL
#define SPLIT_MERGE_CL

#ifndef MERGE_LAST
#define MERGE_LAST 0
#endif
#ifndef MERGE_MAX_SPLITS
#define MERGE_MAX_SPLITS 256
#endif
#ifndef USE_PTX
#define USE_PTX 0
#endif

#define SM_LOCAL_FLOATS(n, dv4) (4 * ((n) > (dv4) ? (n) : (dv4)) + MERGE_MAX_SPLITS + (n) + 1)

#if MERGE_LAST
/* Partials written by other work-groups of this launch. The workspace here is
 * the context's scratch at offset 0, so float4 reads are aligned. */
#define SM_QUAL volatile
#define SM_LOAD4(p) (*(SM_QUAL __global const float4 *)(p))
#else
#define SM_QUAL
#define SM_LOAD4(p) vload4(0, (p))
#endif

/* max (is_max) or sum of v over work-items 0..n-1 (any n); every work-item
 * gets the result, and Red is free again on return. */
inline float sm_reduce(float v, __local float *Red, int tid, int n, int is_max) {
  Red[tid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int width = n; width > 1;) {
    const int h = (width + 1) / 2;
    if (tid < width - h) Red[tid] = is_max ? fmax(Red[tid], Red[tid + h]) : Red[tid] + Red[tid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
    width = h;
  }
  const float r = Red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

/* One row's num_splits partials (wo, wl: the row's first split), merged by
 * work-items 0..n-1 of the work-group together: the normalised o row is left
 * in ((__local float4 *)loc)[0, dv4) and every work-item gets the LSE
 * (natural log). The row stays there until the next call's reductions, so the
 * caller stores it from there without a barrier of its own. */
inline float sm_merge_row(SM_QUAL __global const float *wo, SM_QUAL __global const float *wl, int num_splits,
                          int dv4, int tid, int n, __local float *loc) {
  const int msg = n > dv4 ? n / dv4 : 1;
  __local float4 *Acc = (__local float4 *)loc;
  __local float *W = loc + 4 * (n > dv4 ? n : dv4);
  __local float *Red = W + MERGE_MAX_SPLITS;
  float m = -INFINITY;
  for (int s = tid; s < num_splits; s += n) {
    const float ls = wl[s];
    W[s] = ls;
    m = fmax(m, ls);
  }
  m = sm_reduce(m, Red, tid, n, 1);
  float sum = 0.0f;
  for (int s = tid; s < num_splits; s += n) { /* each work-item rereads its own W[s] */
    const float ls = W[s];
    const float w = (m == -INFINITY || ls == -INFINITY) ? 0.0f : exp2(ls - m);
    W[s] = w;
    sum += w;
  }
  sum = sm_reduce(sum, Red, tid, n, 0); /* its barriers publish W */
  for (int e = tid; e < msg * dv4; e += n) {
    const int sg = e / dv4, g = e - (e / dv4) * dv4;
    float4 a = (float4)(0.0f);
    for (int s = sg; s < num_splits; s += msg) a = mad((float4)(W[s]), SM_LOAD4(wo + (long)s * 4 * dv4 + 4 * g), a);
    Acc[e] = a;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  /* Granule g's msg sums are read and replaced by their owner alone. */
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int g = tid; g < dv4; g += n) {
    float4 a = Acc[g];
    for (int i = 1; i < msg; i++) a += Acc[i * dv4 + g];
    Acc[g] = a * inv;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  return sum > 0.0f ? (m + log2(sum)) * M_LN2_F : -INFINITY;
}

#if MERGE_LAST
inline void sm_global_fence(void) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);
#if USE_PTX
  __asm__ volatile("membar.gl;" ::: "memory");
#endif
}

/* 1 in every work-item of the work-group that arrives last at counter cid:
 * the one-launch form's tail, in every work-item of a split's work-group once
 * its partials are stored. */
inline int sm_arrive(__global uint *counters, long cid, int num_splits, __local float *loc, int n, int dv4) {
  __local int *flag = (__local int *)(loc + SM_LOCAL_FLOATS(n, dv4) - 1);
  sm_global_fence();
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  if (get_local_id(0) == 0) {
    const int last = atomic_inc(counters + cid) == (uint)(num_splits - 1);
    if (last) atomic_xchg(counters + cid, 0u);
    *flag = last;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const int last = *flag;
  if (last) sm_global_fence();
  return last;
}

#endif

#endif
