/* flashcl_attention_decode: split-KV decoding against a paged or contiguous KV
 * cache. Validation is decode_check.c, the plan decode_plan.c; this file
 * holds the workspace, the kernels' set-up and arguments, and the enqueue. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "decode/decode.h"
#include "nvidia/nvidia.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static flashcl_status fcl_decode_check(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                       const flashcl_tensor *q, const flashcl_tensor *kc, const flashcl_tensor *vc,
                                       const flashcl_tensor *o, const flashcl_tensor *lse, fcl_decode_plan *p) {
  flashcl_status st = fcl_decode_validate(ctx, desc, q, kc, vc, o, lse, p);
  if (st != FLASHCL_SUCCESS) return st;
  return fcl_decode_plan_call(ctx, desc, q, kc, vc, p);
}

static flashcl_status fcl_attention_decode_workspace_size_locked(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                                 const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                                 const flashcl_tensor *v_cache, size_t *bytes,
                                                                 int *num_splits) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_decode_desc desc_full;
  flashcl_status imp = fcl_decode_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!bytes) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, NULL, NULL, &p);
  if (st != FLASHCL_SUCCESS) return st;
  *bytes = p.work_floats * sizeof(float);
  if (num_splits) *num_splits = p.splits;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_decode_workspace_size(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                       const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                       const flashcl_tensor *v_cache, size_t *bytes, int *num_splits) {
  fcl_enter(ctx);
  const int d0 = ctx ? ctx->probe_defers : 0;
  size_t b = 0;
  int ns = 0;
  flashcl_status st = fcl_attention_decode_workspace_size_locked(ctx, desc, q, k_cache, v_cache, bytes ? &b : NULL,
                                                                 num_splits ? &ns : NULL);
  if ((st = fcl_query_settled(ctx, d0, st)) == FLASHCL_SUCCESS) {
    *bytes = b;
    if (num_splits) *num_splits = ns;
  }
  return fcl_leave(ctx, st);
}

static void fcl_arg_lse_or_null(fcl_args *a, const flashcl_tensor *lse) {
  if (lse) {
    fcl_arg_mem(a, lse->buffer);
    fcl_arg_long(a, (int64_t)(lse->offset / sizeof(float)));
    fcl_arg_long(a, lse->stride[0]);
    fcl_arg_long(a, lse->stride[1]);
    fcl_arg_long(a, lse->stride[2]);
  } else {
    fcl_arg_mem(a, NULL);
    for (int i = 0; i < 4; i++) fcl_arg_long(a, 0);
  }
  fcl_arg_int(a, lse != NULL);
}

/* 1 if the context's queue is in-order (asked once, cached in the scratch state). */
static int fcl_decode_queue_in_order(flashcl_context *ctx) {
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  if (!sc->queue_ooo) {
    cl_command_queue_properties qp = 0;
    cl_int e = clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof qp, &qp, NULL);
    /* Unknown counts as out-of-order (the safe side). */
    sc->queue_ooo = e == CL_SUCCESS && !(qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) ? 1 : 2;
  }
  return sc->queue_ooo == 1;
}

/* The context's cached scratch (desc.split.workspace NULL), grown to at least `need`
 * bytes (rounded up to 64 KiB). A replaced buffer is released at once: OpenCL
 * frees it once the commands already enqueued on it finish. */
static flashcl_status fcl_decode_scratch(flashcl_context *ctx, size_t need, cl_mem *out) {
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  if (!sc->mem || sc->bytes < need) {
    const size_t gran = 64 * 1024;
    size_t bytes = need;
    if (need <= SIZE_MAX - (gran - 1)) bytes = (need + gran - 1) / gran * gran;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS || !m) {
      /* Retry at the exact size before giving up. */
      if (bytes != need) m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, need, NULL, &err);
      if (err != CL_SUCCESS || !m) return fcl_cl_fail(ctx, err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                                                       "clCreateBuffer(decode workspace)");
      bytes = need;
    }
    if (sc->mem) clReleaseMemObject(sc->mem);
    /* Nothing enqueued so far uses the new buffer. */
    if (sc->last) clReleaseEvent(sc->last);
    sc->last = NULL;
    sc->mem = m;
    sc->bytes = bytes;
  }
  *out = sc->mem;
  return FLASHCL_SUCCESS;
}

/* The context's arrival counters for the one-launch merge, at least `count`
 * of them. A new buffer is zero-filled before use (a blocking write: the
 * kernels then only ever find zeros, and leave them so). */
static flashcl_status fcl_decode_counters(flashcl_context *ctx, size_t count, cl_mem *out) {
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  if (!sc->counters || sc->counter_count < count) {
    const size_t n = count < 1024 ? 1024 : count, bytes = n * sizeof(cl_uint);
    cl_uint *zeros = calloc(n, sizeof(cl_uint));
    if (!zeros) return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err == CL_SUCCESS && m) err = clEnqueueWriteBuffer(ctx->queue, m, CL_TRUE, 0, bytes, zeros, 0, NULL, NULL);
    free(zeros);
    if (err != CL_SUCCESS || !m) {
      if (m) clReleaseMemObject(m);
      return fcl_cl_fail(ctx, err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateBuffer(decode counters)");
    }
    if (sc->counters) clReleaseMemObject(sc->counters);
    sc->counters = m;
    sc->counter_count = n;
  }
  *out = sc->counters;
  return FLASHCL_SUCCESS;
}

/* What the stages of one decode launch share. */
typedef struct fcl_decode_launch {
  flashcl_context *ctx;
  const flashcl_decode_desc *desc;
  fcl_decode_plan *p;
  const flashcl_tensor *q, *kc, *vc, *o, *lse;
  cl_mem seqlens_k;
  int split;    /* the partials of several splits are merged */
  int merge2;   /* ... by decode_merge (else by the attention kernel's last work-groups) */
  int cached;   /* 1: the partials go to the context's cached scratch */
  int in_order; /* the context's queue orders the calls on the scratch itself */
  size_t need;  /* bytes of split partials */
  cl_kernel kern, merge;
  int threads; /* work-items per work-group of kern */
  cl_mem work, counters;
  int64_t wo_off, wl_off; /* floats: the partial outputs, then their LSEs, in work */
} fcl_decode_launch;

/* desc.split.workspace where the call splits and the caller gave one. */
static flashcl_status fcl_decode_caller_workspace(fcl_decode_launch *L) {
  const flashcl_decode_desc *desc = L->desc;
  L->work = NULL;
  if (!L->split || !desc->split.workspace) return FLASHCL_SUCCESS;
  size_t have = 0;
  flashcl_status st = fcl_buffer_size(L->ctx, desc->split.workspace, "desc.split.workspace", &have);
  if (st != FLASHCL_SUCCESS) return st;
  if (desc->split.workspace_offset > have || have - desc->split.workspace_offset < L->need)
    return fcl_fail(L->ctx, FLASHCL_ERROR_BUFFER_TOO_SMALL,
                    "desc.split.workspace holds %zu bytes; offset %zu + %zu bytes of split partials are needed", have,
                    desc->split.workspace_offset, L->need);
  L->work = desc->split.workspace;
  return FLASHCL_SUCCESS;
}

/* The buffers the kernels read must not share bytes with o or lse; the split
 * partials are written, so their range must not touch any tensor or buffer
 * of the call. */
static flashcl_status fcl_decode_check_aux(const fcl_decode_launch *L) {
  flashcl_context *ctx = L->ctx;
  const flashcl_decode_desc *desc = L->desc;
  const fcl_decode_plan *p = L->p;
  const size_t b4 = (size_t)p->batch * sizeof(cl_int);
  fcl_aux aux[8];
  int n = 0;
  flashcl_status st;
  aux[n++] = (fcl_aux){L->seqlens_k, 0, b4, "seqlens_k"};
  if (p->kv.paged) aux[n++] = (fcl_aux){desc->cache.block_table, 0, b4 * (size_t)p->kv.max_pages, "desc.cache.block_table"};
  if (desc->tree_mask) aux[n++] = (fcl_aux){desc->tree_mask, 0, b4 * (size_t)p->q_len, "desc.tree_mask"};
  if (desc->score.alibi_slopes)
    aux[n++] = (fcl_aux){desc->score.alibi_slopes, 0, (size_t)p->heads_q * sizeof(float), "desc.score.alibi_slopes"};
  if (desc->score.sinks) aux[n++] = (fcl_aux){desc->score.sinks, 0, (size_t)p->heads_q * sizeof(float), "desc.score.sinks"};
  if (p->kv.k_quant) aux[n++] = (fcl_aux){desc->cache.k_scale, 0, p->kv.k_scale_bytes, "desc.cache.k_scale"};
  if (p->kv.v_quant) aux[n++] = (fcl_aux){desc->cache.v_scale, 0, p->kv.v_scale_bytes, "desc.cache.v_scale"};
  const flashcl_tensor *outs[2] = {L->o, L->lse};
  static const char *const out_names[2] = {"o", "lse"};
  if ((st = fcl_check_aux_buffers(ctx, aux, n, outs, out_names, 2))) return st;
  if (!L->work) return FLASHCL_SUCCESS;
  const fcl_aux w = {L->work, desc->split.workspace_offset, L->need, "desc.split.workspace"};
  const flashcl_tensor *all[5] = {L->q, L->kc, L->vc, L->o, L->lse};
  static const char *const all_names[5] = {"q", "k_cache", "v_cache", "o", "lse"};
  if ((st = fcl_check_aux_buffers(ctx, &w, 1, all, all_names, 5))) return st;
  for (int i = 0; i < n; i++)
    if (aux[i].mem == L->work && aux[i].offset < desc->split.workspace_offset + L->need &&
        desc->split.workspace_offset < aux[i].offset + aux[i].bytes)
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc.split.workspace overlaps %s", aux[i].name);
  return FLASHCL_SUCCESS;
}

/* decode.cl's build options (decode_attn and decode_merge). */
static void fcl_decode_options(const fcl_decode_launch *L, int page_shift, char *opts, size_t size) {
  const flashcl_decode_desc *desc = L->desc;
  const fcl_decode_plan *p = L->p;
  const char *extra = L->ctx->build_options;
  char quant[96];
  fcl_kv_quant_options(&p->kv, L->kc, L->vc, L->q->dtype, quant, sizeof quant);
  snprintf(opts, size,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DHEAD_DIM_V=%d -DROWS=%d -DNTHREADS=%d -DKPT=%d -DPREFETCH=%d "
           "-DVEC_ALIGNED=%d -DSPLIT=%d -DPAGED=%d -DPAGE_SHIFT=%d -DTREE_MASK=%d -DMERGE_THREADS=%d "
           "-DMERGE_MAX_SPLITS=%d -DMERGE_LAST=%d -DASYNC_STAGES=%d -DUSE_PTX=%d -DWINDOW=%d -DSOFTCAP=%d -DALIBI=%d "
           "-DSINKS=%d -DSM_FENCE_PTX=%d%s%s%s",
           (int)L->q->dtype, p->head_dim, p->head_dim_v, p->rows, p->threads, p->kpt, p->prefetch, p->vec_aligned, L->split,
           p->kv.paged, page_shift, desc->tree_mask != NULL, p->merge_threads, FLASHCL_DECODE_MAX_SPLITS, p->merge_last,
           p->stages,
           p->stages > 0, p->window, desc->score.softcap > 0.0f, desc->score.alibi_slopes != NULL, desc->score.sinks != NULL,
           p->merge_last && fcl_platform_is_nvidia(L->ctx), quant, extra ? " " : "", extra ? extra : "");
}

/* decode_mma for a plan that chose it. */
static flashcl_status fcl_decode_mma_kernel(fcl_decode_launch *L, int page_shift) {
  flashcl_context *ctx = L->ctx;
  fcl_decode_plan *p = L->p;
  const char *extra = ctx->build_options;
  char mopts[512], quant[96] = "";
  flashcl_status st;
  L->threads = 32 * p->mma_wr * p->mma_wk;
  const int kvq = p->kv.k_quant || p->kv.v_quant;
  if (kvq) fcl_kv_quant_options(&p->kv, L->kc, L->vc, L->q->dtype, quant, sizeof quant);
  snprintf(mopts, sizeof mopts,
           "-cl-std=CL1.2 -DUSE_PTX=1 -DDTYPE=%d -DHEAD_DIM=%d -DWR=%d -DWK=%d -DKV_STAGES=%d -DSPLIT=%d "
           "-DMERGE_LAST=%d -DPAGED=%d -DPAGE_SHIFT=%d -DTREE_MASK=%d -DSINKS=%d%s%s%s%s",
           (int)L->q->dtype, p->head_dim, p->mma_wr, p->mma_wk, p->mma_stages, L->split, p->merge_last,
           p->kv.paged, page_shift,
           L->desc->tree_mask != NULL, L->desc->score.sinks != NULL, quant,
           kvq && ctx->mma_cc >= 89 ? " -DCVT_E4M3=1" : "", extra ? " " : "", extra ? extra : "");
  if ((st = fcl_get_kernel(ctx,
                           p->merge_last
                               ? "mma_ptx.cl+kv_quant.cl+kvq_ptx.cl+score_variant.cl+split_merge.cl+decode_mma.cl"
                               : "mma_ptx.cl+kv_quant.cl+kvq_ptx.cl+score_variant.cl+decode_mma.cl",
                           mopts, "decode_mma", &L->kern)))
    return st;
  if (ctx->verbose >= 2) fcl_print_build_log(ctx, L->kern, "decode_mma", mopts);
  size_t mwg = 0;
  if (clGetKernelWorkGroupInfo(L->kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof mwg, &mwg, NULL) ==
          CL_SUCCESS &&
      mwg < (size_t)L->threads) {
    /* Its registers do not allow that many warps (a tuning override): the
     * cp.async kernel, planned for the same split count, takes the call. */
    fcl_log(ctx, "decode_mma: %d work-items planned, %zu allowed; running decode_attn", L->threads, mwg);
    p->mma = 0;
    p->row_blocks = (p->group * p->q_len + p->rows - 1) / p->rows;
    L->threads = p->threads;
  }
  return FLASHCL_SUCCESS;
}

/* decode_cpu.cl's kernel for a plan with map = 1, and decode.cl's program for
 * decode_merge built with the smallest mapping its checks take (one row, one
 * key group), which its merge kernel does not read. */
static flashcl_status fcl_decode_cpu_kernels(fcl_decode_launch *L, int page_shift) {
  flashcl_context *ctx = L->ctx;
  const fcl_decode_plan *p = L->p;
  const flashcl_decode_desc *desc = L->desc;
  const char *extra = ctx->build_options;
  char opts[512], quant[96];
  flashcl_status st;
  fcl_kv_quant_options(&p->kv, L->kc, L->vc, L->q->dtype, quant, sizeof quant);
  snprintf(opts, sizeof opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DHEAD_DIM_V=%d -DROWS=%d -DBLOCK_C=%d -DSPLIT=%d -DPAGED=%d "
           "-DTREE_MASK=%d -DWINDOW=%d -DSOFTCAP=%d -DALIBI=%d -DSINKS=%d%s%s%s",
           (int)L->q->dtype, p->head_dim, p->head_dim_v, p->rows, p->tile, L->split, p->kv.paged,
           desc->tree_mask != NULL, p->window, desc->score.softcap > 0.0f, desc->score.alibi_slopes != NULL,
           desc->score.sinks != NULL, quant, extra ? " " : "", extra ? extra : "");
  L->threads = 1;
  L->merge = NULL;
  if ((st = fcl_get_kernel(ctx, "dtype.cl+kv_quant.cl+score_variant.cl+decode_keys.cl+decode_cpu.cl", opts,
                           "decode_attn_cpu", &L->kern)))
    return st;
  if (!L->merge2) return FLASHCL_SUCCESS;
  fcl_decode_plan mp = *p;
  mp.rows = 1;
  mp.threads = p->head_dim / 8;
  mp.kpt = 1;
  fcl_decode_launch ml = *L;
  ml.p = &mp;
  fcl_decode_options(&ml, page_shift, opts, sizeof opts);
  return fcl_get_kernel(ctx, "dtype.cl+kv_quant.cl+score_variant.cl+decode_keys.cl+decode.cl", opts, "decode_merge",
                        &L->merge);
}

/* The attention kernel (decode_mma, or decode_attn where it is not planned or
 * cannot run as planned; decode_attn_cpu with map = 1) and, when split,
 * decode_merge. */
static flashcl_status fcl_decode_kernels(fcl_decode_launch *L) {
  flashcl_context *ctx = L->ctx;
  const fcl_decode_plan *p = L->p;
  const int page_shift = p->kv.paged ? fcl_page_shift(p->kv.page_size) : -1;
  char opts[512];
  flashcl_status st;
  if (p->map) return fcl_decode_cpu_kernels(L, page_shift);
  fcl_decode_options(L, page_shift, opts, sizeof opts);
  /* The cp.async helpers live in mma_ptx.cl, compiled first into the same program. */
  static const char *const files[2][2] = {
      {"dtype.cl+kv_quant.cl+score_variant.cl+decode_keys.cl+decode.cl",
       "dtype.cl+kv_quant.cl+score_variant.cl+split_merge.cl+decode_keys.cl+decode.cl"},
      {"mma_ptx.cl+dtype.cl+kv_quant.cl+score_variant.cl+decode_keys.cl+decode.cl",
       "mma_ptx.cl+dtype.cl+kv_quant.cl+score_variant.cl+split_merge.cl+decode_keys.cl+decode.cl"}};
  const char *file = files[p->stages > 0][p->merge_last];
  L->merge = NULL;
  L->threads = p->threads;
  if (p->mma && (st = fcl_decode_mma_kernel(L, page_shift))) return st;
  if (!p->mma && (st = fcl_get_kernel(ctx, file, opts, "decode_attn", &L->kern))) return st;
  if (L->merge2 && (st = fcl_get_kernel(ctx, file, opts, "decode_merge", &L->merge))) return st;
  size_t kwg = 0;
  /* (decode_mma was checked above.) */
  if (!p->mma &&
      clGetKernelWorkGroupInfo(L->kern, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
          CL_SUCCESS &&
      kwg < (size_t)L->threads)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s needs %d work-items but the compiled kernel allows %zu",
                    p->mma ? "decode_mma" : "decode_attn", L->threads, kwg);
  return FLASHCL_SUCCESS;
}

static cl_int fcl_decode_attn_args(const fcl_decode_launch *L) {
  const flashcl_decode_desc *desc = L->desc;
  const fcl_decode_plan *p = L->p;
  const float log2e = 1.4426950408889634f;
  fcl_args a = {L->kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, L->q);
  fcl_arg_tensor(&a, L->kc);
  fcl_arg_tensor(&a, L->vc);
  fcl_arg_tensor(&a, L->o);
  fcl_arg_lse_or_null(&a, L->lse);
  fcl_arg_mem(&a, L->seqlens_k);
  fcl_arg_mem(&a, desc->tree_mask);
  fcl_arg_mem(&a, p->kv.paged ? desc->cache.block_table : NULL);
  fcl_arg_int(&a, p->kv.max_pages);
  fcl_arg_int(&a, p->kv.page_size);
  fcl_arg_int(&a, p->kv.num_pages);
  fcl_arg_int(&a, p->kv.capacity);
  fcl_arg_int(&a, p->q_len);
  fcl_arg_int(&a, p->group);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_int(&a, p->row_blocks);
  fcl_arg_int(&a, p->splits);
  fcl_arg_float(&a, p->scale * log2e);
  fcl_arg_mem(&a, L->work);
  fcl_arg_long(&a, L->wo_off);
  fcl_arg_long(&a, L->wl_off);
  if (!p->mma) { /* decode_attn's score variants (decode_mma never runs with them) */
    fcl_arg_int(&a, desc->score.window_left);
    fcl_arg_int(&a, desc->score.window_right);
    fcl_arg_mem(&a, desc->score.alibi_slopes);
    fcl_arg_float(&a, desc->score.softcap > 0.0f ? 0.6931471805599453f / desc->score.softcap : 0.0f);
    fcl_arg_float(&a, desc->score.softcap * log2e);
  }
  /* Both kernels take the sinks and the quantized caches' scales after the rest. */
  fcl_arg_mem(&a, desc->score.sinks);
  fcl_arg_mem(&a, p->kv.k_quant ? desc->cache.k_scale : NULL);
  fcl_arg_mem(&a, p->kv.v_quant ? desc->cache.v_scale : NULL);
  fcl_arg_mem(&a, L->counters);
  return a.err;
}

/* decode_merge after the attention kernel (its event ev where the queue is
 * out-of-order). The arguments are set once the attention kernel is on its
 * way: a single call's latency includes the host time before that enqueue. */
static cl_int fcl_decode_merge(const fcl_decode_launch *L, cl_event ev, cl_event *done, const char **failed) {
  const fcl_decode_plan *p = L->p;
  fcl_args m = {L->merge, 0, CL_SUCCESS};
  fcl_arg_mem(&m, L->work);
  fcl_arg_long(&m, L->wo_off);
  fcl_arg_long(&m, L->wl_off);
  fcl_arg_int(&m, p->splits);
  fcl_arg_int(&m, p->q_len);
  fcl_arg_int(&m, p->heads_q);
  fcl_arg_tensor(&m, L->o);
  fcl_arg_lse_or_null(&m, L->lse);
  if (m.err != CL_SUCCESS) {
    *failed = "clSetKernelArg(decode_merge)";
    return m.err;
  }
  /* Out-of-order queues (flashcl_context_create_from_cl) order the merge by event. */
  size_t mg[3] = {(size_t)p->merge_threads, (size_t)p->q_len * p->heads_q, (size_t)p->batch};
  size_t ml[3] = {(size_t)p->merge_threads, 1, 1};
  return clEnqueueNDRangeKernel(L->ctx->queue, L->merge, 3, NULL, mg, ml, ev ? 1 : 0, ev ? &ev : NULL, done);
}

/* The attention kernel, then decode_merge where it merges. On an out-of-order queue a
 * call on the cached scratch waits for the previous one (its merge still
 * reads the partials); an in-order queue orders them. */
static flashcl_status fcl_decode_enqueue(const fcl_decode_launch *L, cl_uint num_events_in_wait_list,
                                         const cl_event *event_wait_list, cl_event *out_event) {
  flashcl_context *ctx = L->ctx;
  const fcl_decode_plan *p = L->p;
  struct fcl_decode_scratch *sc = &ctx->decode_scratch;
  const int chain = L->cached && !L->in_order, merge2 = L->merge2;
  const cl_event *wait = num_events_in_wait_list ? event_wait_list : NULL;
  cl_uint nwait = num_events_in_wait_list;
  cl_event wait_buf[16], *wait_heap = NULL;
  if (chain && sc->last) {
    cl_event *w = wait_buf;
    if (nwait + 1 > sizeof wait_buf / sizeof wait_buf[0]) {
      wait_heap = malloc(sizeof(cl_event) * ((size_t)nwait + 1));
      if (!wait_heap) return fcl_fail(ctx, FLASHCL_ERROR_HOST_OUT_OF_MEMORY, "out of host memory");
      w = wait_heap;
    }
    for (cl_uint i = 0; i < nwait; i++) w[i] = event_wait_list[i];
    w[nwait++] = sc->last;
    wait = w;
  }

  size_t global[3] = {(size_t)L->threads * p->splits, (size_t)p->heads_kv * p->row_blocks, (size_t)p->batch};
  size_t local[3] = {(size_t)L->threads, 1, 1};
  /* Events only where something waits on them: with profiling on, an event costs
   * the NVIDIA driver host time per enqueue, a large share of a short call
   * (BENCHMARKS.md). */
  cl_event ev = NULL, done = NULL;
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, L->kern, 3, NULL, global, local, nwait, wait,
                                      merge2 ? (L->in_order ? NULL : &ev) : (out_event || chain) ? &done : NULL);
  free(wait_heap);
  const char *failed = "clEnqueueNDRangeKernel(decode)";
  /* If the merge cannot be enqueued the partials are lost, but o and lse are untouched. */
  if (err == CL_SUCCESS && merge2) err = fcl_decode_merge(L, ev, (out_event || chain) ? &done : NULL, &failed);
  if (chain && (done || ev)) {
    /* The scratch's last user: the merge, or the attention kernel if the merge
     * could not be enqueued. */
    if (sc->last) clReleaseEvent(sc->last);
    sc->last = done ? done : ev;
    clRetainEvent(sc->last);
  }
  if (out_event && err == CL_SUCCESS) *out_event = done;
  else if (done) clReleaseEvent(done);
  if (ev) clReleaseEvent(ev);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, failed);
  return FLASHCL_SUCCESS;
}

static flashcl_status fcl_attention_decode_locked(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                                  const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                                  const flashcl_tensor *v_cache, cl_mem seqlens_k,
                                                  const flashcl_tensor *o, const flashcl_tensor *lse,
                                                  cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                  cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_decode_desc desc_full;
  flashcl_status imp = fcl_decode_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!o) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "o is NULL");
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, o, lse, &p);
  if (st != FLASHCL_SUCCESS) return st;
  if ((st = fcl_check_seqlens(ctx, seqlens_k, "seqlens_k", p.batch))) return st;
  fcl_decode_launch L = {.ctx = ctx, .desc = desc, .p = &p, .q = q, .kc = k_cache, .vc = v_cache, .o = o,
                         .lse = lse, .seqlens_k = seqlens_k};
  L.split = p.splits > 1;
  L.merge2 = L.split && !p.merge_last;
  L.need = p.work_floats * sizeof(float);
  if ((st = fcl_decode_caller_workspace(&L)) || (st = fcl_decode_check_aux(&L))) return st;
  L.cached = L.split && !L.work;
  L.in_order = fcl_decode_queue_in_order(ctx);
  if ((st = fcl_decode_kernels(&L))) return st;

  if (L.cached && (st = fcl_decode_scratch(ctx, L.need, &L.work))) return st;
  if (p.merge_last &&
      (st = fcl_decode_counters(ctx, (size_t)p.batch * (size_t)p.heads_kv * (size_t)p.row_blocks *
                                            (size_t)fcl_dec_merge_counters(p.splits),
                                &L.counters)))
    return st;
  L.wo_off = L.split ? (int64_t)((L.cached ? 0 : desc->split.workspace_offset) / sizeof(float)) : 0;
  L.wl_off = L.wo_off + (int64_t)(p.work_floats / ((size_t)p.head_dim_v + 1) * (size_t)p.head_dim_v);
  cl_int err = fcl_decode_attn_args(&L);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clSetKernelArg(decode)");
  return fcl_decode_enqueue(&L, num_events_in_wait_list, event_wait_list, out_event);
}

flashcl_status flashcl_attention_decode(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                                        const flashcl_tensor *k_cache, const flashcl_tensor *v_cache, cl_mem seqlens_k,
                                        const flashcl_tensor *o, const flashcl_tensor *lse,
                                        cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                        cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_attention_decode_locked(ctx, desc, q, k_cache, v_cache, seqlens_k, o, lse,
                                                    num_events_in_wait_list, event_wait_list, out_event));
}

static flashcl_status fcl_decode_config_locked(flashcl_context *ctx, const flashcl_decode_desc *desc,
                                               const flashcl_tensor *q, const flashcl_tensor *k_cache,
                                               const flashcl_tensor *v_cache, flashcl_config *config) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_decode_desc desc_full;
  flashcl_status imp = fcl_decode_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!config) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "config is NULL");
  fcl_decode_plan p;
  flashcl_status st = fcl_decode_check(ctx, desc, q, k_cache, v_cache, NULL, NULL, &p);
  if (st != FLASHCL_SUCCESS) return st;
  flashcl_config c;
  memset(&c, 0, sizeof c);
  fcl_tuned_report(&p.tu, &c);
  snprintf(c.kernel, sizeof c.kernel, "%s",
           p.mma ? "decode_mma" : p.map ? "decode_attn_cpu" : p.stages ? "decode_attn (cp.async)" : "decode_attn");
  c.block_r = p.mma ? 16 * p.mma_wr : p.rows;
  c.block_c = p.mma ? 16 * p.mma_wk : p.tile;
  c.threads = p.mma ? 32 * p.mma_wr * p.mma_wk : p.threads;
  c.local_bytes = p.mma ? fcl_dec_mma_local_bytes(p.head_dim, p.mma_wr, p.mma_wk, p.mma_stages, &p.kv,
                                                  p.merge_last ? fcl_dec_merge_floats(16 * p.mma_wr)
                                                               : 0)
                         : p.local_bytes;
  *config = c;
  return FLASHCL_SUCCESS;
}

flashcl_status flashcl_decode_config(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *q,
                                     const flashcl_tensor *k_cache, const flashcl_tensor *v_cache,
                                     flashcl_config *config) {
  fcl_enter(ctx);
  const int d0 = ctx ? ctx->probe_defers : 0;
  flashcl_config c;
  flashcl_status st = fcl_decode_config_locked(ctx, desc, q, k_cache, v_cache, config ? &c : NULL);
  if ((st = fcl_query_settled(ctx, d0, st)) == FLASHCL_SUCCESS) *config = c;
  return fcl_leave(ctx, st);
}
