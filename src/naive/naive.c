/* The naive baseline: S = scale * Q K^T and O = P V as CLBlast SGEMMs, with a
 * softmax kernel between them. It materialises the N x N score matrix on
 * purpose: it is the reference point for flashcl's speed and memory figures.
 *
 * Inputs are first copied to dense fp32 (also how fp16/bf16 run on devices
 * without cl_khr_fp16, such as NVIDIA's OpenCL), and the caller's o and lse are
 * written by the last kernel only, so a failure anywhere earlier leaves them
 * untouched. */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "naive/naive.h"

#include <clblast_c.h>
#include <stdio.h>

typedef struct fcl_naive_sizes {
  /* Floats in Q (and dQ), K (and dK), O (and dO), V (and dV), S/P and the LSE
   * scratch; o and v count head_dim_v columns, q and kv head_dim. */
  size_t q, kv, o, v, s, lse;
} fcl_naive_sizes;

static size_t fcl_size_max(size_t a, size_t b) { return a > b ? a : b; }

static flashcl_status fcl_naive_sizes_of(flashcl_context *ctx, const fcl_problem *p, fcl_naive_sizes *z,
                                         size_t *bytes) {
  size_t rows_q, rows_k, t;
  int ok = fcl_mul_size((size_t)p->batch * (size_t)p->heads_q, (size_t)p->seqlen_q, &rows_q) &&
           fcl_mul_size((size_t)p->batch * (size_t)p->heads_kv, (size_t)p->seqlen_k, &rows_k) &&
           fcl_mul_size(rows_q, (size_t)p->head_dim, &z->q) && fcl_mul_size(rows_k, (size_t)p->head_dim, &z->kv) &&
           fcl_mul_size(rows_q, (size_t)p->head_dim_v, &z->o) && fcl_mul_size(rows_k, (size_t)p->head_dim_v, &z->v) &&
           fcl_mul_size(rows_q, (size_t)p->seqlen_k, &z->s);
  z->lse = rows_q;
  /* The forward's buffers: Q (then O), K, V, S and the LSE scratch. */
  ok = ok && fcl_add_size(fcl_size_max(z->q, z->o), z->kv, &t) && fcl_add_size(t, z->v, &t) &&
       fcl_add_size(t, z->s, &t) && fcl_add_size(t, z->lse, &t) && fcl_mul_size(t, sizeof(float), bytes);
  if (!ok) return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "naive workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_naive_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes) {
  fcl_naive_sizes z;
  return fcl_naive_sizes_of(ctx, p, &z, bytes);
}

/* CLBlast's batched GEMM kernels index a buffer with 32-bit integers: on an
 * NVIDIA H100 a score matrix of more than 2^31 floats (e.g. 16 heads at
 * N = 16384) made the GEMM fault and left the context unusable. Refuse such calls
 * up front with a clean status instead. */
#define FCL_BLAS_MAX_ELEMENTS ((size_t)1 << 31)

static flashcl_status fcl_blas_limit(flashcl_context *ctx, const fcl_naive_sizes *z) {
  if (z->s <= FCL_BLAS_MAX_ELEMENTS && fcl_size_max(z->q, z->o) <= FCL_BLAS_MAX_ELEMENTS &&
      fcl_size_max(z->kv, z->v) <= FCL_BLAS_MAX_ELEMENTS)
    return FLASHCL_SUCCESS;
  return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                  "naive attention: the score matrices of this call hold %zu floats, more than the 2^31 that "
                  "CLBlast's GEMM kernels can index; use the flash path or fewer heads per call",
                  z->s);
}

static flashcl_status fcl_blas_fail(flashcl_context *ctx, CLBlastStatusCode code, const char *what) {
  if (code > -1000) return fcl_cl_fail(ctx, (cl_int)code, what);
  return fcl_fail(ctx, FLASHCL_ERROR_BLAS, "%s failed: CLBlast status %d", what, (int)code);
}

/* One strided-batched SGEMM over the (sequence, kv-head) groups, row-major. */
static flashcl_status fcl_gemm(flashcl_context *ctx, const char *what, int ta, int tb, size_t m, size_t n, size_t kk,
                               float alpha, cl_mem a, size_t lda, size_t sa, cl_mem b, size_t ldb, size_t sb, cl_mem c,
                               size_t ldc, size_t sc, size_t batch) {
  cl_command_queue queue = ctx->queue;
  CLBlastStatusCode bs = CLBlastSgemmStridedBatched(
      CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo, tb ? CLBlastTransposeYes : CLBlastTransposeNo,
      m, n, kk, alpha, a, 0, lda, sa, b, 0, ldb, sb, 0.0f, c, 0, ldc, sc, batch, &queue, NULL);
  return bs == CLBlastSuccess ? FLASHCL_SUCCESS : fcl_blas_fail(ctx, bs, what);
}

static flashcl_status fcl_enqueue(flashcl_context *ctx, cl_kernel kern, size_t g0, size_t g1, size_t g2,
                                  size_t l0, cl_uint nwait, const cl_event *wait, cl_event *ev, const char *what) {
  size_t global[3] = {g0, g1, g2};
  size_t local[3] = {l0, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, l0 ? local : NULL, nwait,
                                      nwait ? wait : NULL, ev);
  return err == CL_SUCCESS ? FLASHCL_SUCCESS : fcl_cl_fail(ctx, err, what);
}

static flashcl_status fcl_pack(flashcl_context *ctx, cl_kernel kern, const flashcl_tensor *t, cl_mem dst,
                               int heads, int padded, int batch, cl_mem cu, int total, cl_uint nwait,
                               const cl_event *wait, int dim) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, t);
  fcl_arg_mem(&a, dst);
  fcl_arg_int(&a, heads);
  fcl_arg_int(&a, padded);
  fcl_arg_mem(&a, cu);
  fcl_arg_int(&a, total);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_pack)");
  return fcl_enqueue(ctx, kern, (size_t)dim, (size_t)padded, (size_t)batch * heads, 0, nwait, wait, NULL,
                     "enqueue naive_pack");
}

/* naive_pack_paged: K or V of every sequence gathered from the page pool t;
 * naive_pack_paged_q (kern_q) when t is quantized, with its scales. */
static flashcl_status fcl_pack_paged(flashcl_context *ctx, cl_kernel kern, cl_kernel kern_q, const flashcl_tensor *t,
                                     cl_mem scale, int kind, cl_mem dst, const fcl_problem *p, cl_uint nwait,
                                     const cl_event *wait) {
  const int quant = fcl_dtype_is_kv_quant(t->dtype);
  if (quant) kern = kern_q;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, t);
  fcl_arg_mem(&a, dst);
  fcl_arg_int(&a, p->heads_kv);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_mem(&a, p->kv_block_table);
  fcl_arg_int(&a, p->kv_page_size);
  fcl_arg_int(&a, p->kv_max_pages);
  fcl_arg_int(&a, p->kv_num_pages);
  fcl_arg_mem(&a, p->kv_seqlens);
  if (quant) {
    fcl_arg_mem(&a, scale);
    fcl_arg_int(&a, (int)t->dtype);
    fcl_arg_int(&a, kind);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_pack_paged)");
  return fcl_enqueue(ctx, kern, (size_t)fcl_kv_head_dim(t), (size_t)p->seqlen_k, (size_t)p->batch * p->heads_kv, 0,
                     nwait, wait, NULL, "enqueue naive_pack_paged");
}

static flashcl_status fcl_softmax(flashcl_context *ctx, cl_kernel kern, cl_mem scores, cl_mem lse_ws,
                                  const fcl_problem *p, cl_mem cu_q, cl_mem cu_k, int tq, int tk, int wg, size_t rows) {
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_mem(&a, scores);
  fcl_arg_mem(&a, lse_ws);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_mem(&a, cu_q);
  fcl_arg_mem(&a, cu_k);
  fcl_arg_int(&a, tq);
  fcl_arg_int(&a, tk);
  fcl_arg_int(&a, p->window_left);
  fcl_arg_int(&a, p->window_right);
  fcl_arg_mem(&a, p->alibi);
  fcl_arg_float(&a, p->softcap);
  fcl_arg_mem(&a, p->sinks);
  fcl_arg_mask(&a, p);
  if (p->paged_kv) fcl_arg_mem(&a, p->kv_seqlens); /* only built with -DPAGED_KV=1 */
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_softmax)");
  return fcl_enqueue(ctx, kern, rows * (size_t)wg, 1, 1, (size_t)wg, 0, NULL, NULL, "enqueue naive_softmax");
}

/* Writes rows of a dense fp32 [seq][head][row][d] buffer into a caller's tensor
 * (and the LSE scratch into lse when given). */
static flashcl_status fcl_unpack(flashcl_context *ctx, cl_kernel kern, cl_mem src, cl_mem lse_ws,
                                 const flashcl_tensor *t, const flashcl_tensor *lse, int heads, int padded, int batch,
                                 cl_mem cu, int total, int d, cl_event *ev) {
  /* The backward's unpacks share this kernel, so the dk and dv ones are set
   * up after dq's is enqueued: a shortage then gets one more try. */
  for (int again = 0;; again++) {
    fcl_args a = {kern, 0, CL_SUCCESS};
    fcl_arg_mem(&a, src);
    fcl_arg_mem(&a, lse_ws);
    fcl_arg_tensor(&a, t);
    fcl_arg_lse(&a, lse);
    fcl_arg_int(&a, lse != NULL);
    fcl_arg_int(&a, heads);
    fcl_arg_int(&a, padded);
    fcl_arg_mem(&a, cu);
    fcl_arg_int(&a, total);
    size_t global[3] = {(size_t)d, (size_t)padded, (size_t)batch * heads};
    const cl_int err = a.err != CL_SUCCESS ? a.err : clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, NULL,
                                                                             0, NULL, ev);
    const char *what = a.err != CL_SUCCESS ? "clSetKernelArg(naive_unpack)" : "enqueue naive_unpack";
    if (err == CL_SUCCESS) return FLASHCL_SUCCESS;
    if (again || !fcl_retry_after_flush(ctx, NULL, err, what)) return fcl_cl_fail(ctx, err, what);
  }
}

/* dst = P * Z / (1 - p) over the dense [seq][head][row][col] score layout. */
static flashcl_status fcl_dropout_apply(flashcl_context *ctx, const char *src, const char *opts, cl_mem from, cl_mem to,
                                       const fcl_problem *p) {
  cl_kernel kern;
  flashcl_status st = fcl_get_kernel(ctx, src, opts, "naive_dropout", &kern);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_mem(&a, from);
  fcl_arg_mem(&a, to);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_dropout(&a, p);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(naive_dropout)");
  return fcl_enqueue(ctx, kern, (size_t)p->seqlen_k, (size_t)p->seqlen_q, (size_t)p->batch * p->heads_q, 0, 0, NULL,
                     NULL, "enqueue naive_dropout");
}

/* Refuses a call whose scratch the device cannot hold, or whose GEMMs CLBlast
 * cannot index, before anything is built or allocated. */
static flashcl_status fcl_naive_fits(flashcl_context *ctx, const fcl_naive_sizes *z, size_t total_bytes,
                                     int backward) {
  const size_t largest = fcl_size_max(z->s, fcl_size_max(z->q, z->o));
  if (largest * sizeof(float) > ctx->info.max_mem_alloc_size || total_bytes > ctx->info.global_mem_size) {
    if (backward)
      return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                      "naive attention backward needs %zu bytes of scratch (two N x N matrices of %zu bytes each); "
                      "the device allows %llu bytes per buffer and has %llu in all",
                      total_bytes, z->s * sizeof(float), (unsigned long long)ctx->info.max_mem_alloc_size,
                      (unsigned long long)ctx->info.global_mem_size);
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                    "naive attention needs %zu bytes of scratch (an N x N score matrix of %zu bytes); the device "
                    "allows %llu bytes per buffer and has %llu in all",
                    total_bytes, z->s * sizeof(float), (unsigned long long)ctx->info.max_mem_alloc_size,
                    (unsigned long long)ctx->info.global_mem_size);
  }
  return fcl_blas_limit(ctx, z);
}

/* What the stages of one forward or backward call share. */
typedef struct fcl_naive_call {
  flashcl_context *ctx;
  const fcl_problem *p;
  int wg; /* work-items per softmax / dS row */
  char opts[288];
  char src[96];
  cl_kernel pack, soft, unpack;
  cl_kernel extra;   /* naive_pack_paged (paged forward) or naive_ds (backward) */
  cl_kernel extra_q; /* naive_pack_paged_q: a quantized pool of a paged forward */
  int ooo;         /* CLBlast takes no wait list, so an out-of-order queue needs explicit barriers */
  cl_mem cu_q, cu_k;
  int tq, tk, d, dv; /* d: q/k head dim, dv: v/o head dim */
  size_t g, lq, lk, groups; /* GQA group, lengths, and the GEMMs' batch of (sequence, kv-head) groups */
} fcl_naive_call;

/* The kernels every naive call runs, then `extra` (NULL: none). */
static flashcl_status fcl_naive_kernels(fcl_naive_call *c, const char *extra) {
  flashcl_context *ctx = c->ctx;
  const fcl_problem *p = c->p;
  c->wg = ctx->info.max_work_group_size >= 64 ? 64 : 1;
  char variants[160];
  snprintf(c->opts, sizeof c->opts,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DCAUSAL=%d -DVARLEN=%d -DWG=%d -DDROPOUT=%d%s", (int)p->dtype,
           p->head_dim, p->causal && !p->window, p->varlen, c->wg, p->dropout,
           fcl_variant_options(p, variants, sizeof variants));
  /* Dropout, masks and quantized pools bring their helper files into the program. */
  const int quant = p->k_quant || p->v_quant;
  snprintf(c->src, sizeof c->src, "%s%sdtype.cl+%sseq_bounds.cl+score_variant.cl+naive.cl",
           p->dropout ? "philox.cl+" : "", p->mask_kind ? "mask.cl+" : "", quant ? "kv_quant.cl+" : "");
  c->extra = c->extra_q = NULL;
  flashcl_status st;
  if ((st = fcl_get_kernel(ctx, c->src, c->opts, "naive_pack", &c->pack)) ||
      (st = fcl_get_kernel(ctx, c->src, c->opts, "naive_softmax", &c->soft)) ||
      (st = fcl_get_kernel(ctx, c->src, c->opts, "naive_unpack", &c->unpack)) ||
      (extra && (st = fcl_get_kernel(ctx, c->src, c->opts, extra, &c->extra))) ||
      (quant && (st = fcl_get_kernel(ctx, c->src, c->opts, "naive_pack_paged_q", &c->extra_q))))
    return st;
  return FLASHCL_SUCCESS;
}

/* counts[i] floats in buf[i], except buf[skip] (-1: none). On failure the
 * caller releases the buffers already made. */
static flashcl_status fcl_naive_alloc(flashcl_context *ctx, cl_mem *buf, const size_t *counts, int n, int skip,
                                      const char *what) {
  for (int i = 0; i < n; i++) {
    cl_int err;
    if (i == skip) continue;
    buf[i] = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, counts[i] * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, what);
  }
  return FLASHCL_SUCCESS;
}

static void fcl_naive_layout(fcl_naive_call *c, const flashcl_attention_desc *desc, const flashcl_tensor *q,
                             const flashcl_tensor *k) {
  const fcl_problem *p = c->p;
  cl_command_queue_properties qprops = 0;
  clGetCommandQueueInfo(c->ctx->queue, CL_QUEUE_PROPERTIES, sizeof qprops, &qprops, NULL);
  c->ooo = (qprops & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
  c->cu_q = p->varlen ? desc->varlen.cu_seqlens_q : NULL;
  c->cu_k = p->varlen ? desc->varlen.cu_seqlens_k : NULL;
  c->tq = (int)q->shape[1];
  c->tk = (int)k->shape[1];
  c->d = p->head_dim;
  c->dv = p->head_dim_v;
  c->g = (size_t)(p->heads_q / p->heads_kv);
  c->lq = (size_t)p->seqlen_q;
  c->lk = (size_t)p->seqlen_k;
  c->groups = (size_t)p->batch * (size_t)p->heads_kv;
}

/* Orders the next command after the previous ones on an out-of-order queue. */
static void fcl_naive_order(const fcl_naive_call *c) {
  if (c->ooo) clEnqueueBarrierWithWaitList(c->ctx->queue, 0, NULL, NULL);
}

/* Packs a query-side (q_side) or key-side tensor of the caller into dense fp32,
 * rows of its own head dim (q/k: head_dim, v/o/dO: head_dim_v). */
static flashcl_status fcl_naive_pack(const fcl_naive_call *c, const flashcl_tensor *t, cl_mem dst, int q_side,
                                     cl_uint nwait, const cl_event *wait) {
  const fcl_problem *p = c->p;
  if (q_side)
    return fcl_pack(c->ctx, c->pack, t, dst, p->heads_q, p->seqlen_q, p->batch, c->cu_q, c->tq, nwait, wait,
                    (int)t->shape[3]);
  return fcl_pack(c->ctx, c->pack, t, dst, p->heads_kv, p->seqlen_k, p->batch, c->cu_k, c->tk, nwait, wait,
                  (int)t->shape[3]);
}

/* Writes a dense fp32 query-side (q_side) or key-side result into a caller's tensor. */
static flashcl_status fcl_naive_unpack(const fcl_naive_call *c, cl_mem src, cl_mem lse_ws, const flashcl_tensor *t,
                                       const flashcl_tensor *lse, int q_side, cl_event *ev) {
  const fcl_problem *p = c->p;
  if (q_side)
    return fcl_unpack(c->ctx, c->unpack, src, lse_ws, t, lse, p->heads_q, p->seqlen_q, p->batch, c->cu_q, c->tq,
                      (int)t->shape[3], ev);
  return fcl_unpack(c->ctx, c->unpack, src, lse_ws, t, lse, p->heads_kv, p->seqlen_k, p->batch, c->cu_k, c->tk,
                    (int)t->shape[3], ev);
}

enum { FWD_Q, FWD_K, FWD_V, FWD_S, FWD_LSE, FWD_NBUF }; /* FWD_Q is reused for O */

/* Q, K and V in dense fp32, after the caller's wait list. */
static flashcl_status fcl_naive_forward_pack(const fcl_naive_call *c, const flashcl_tensor *q,
                                             const flashcl_tensor *k, const flashcl_tensor *v, const cl_mem *buf,
                                             cl_uint nwait, const cl_event *wait) {
  const fcl_problem *p = c->p;
  flashcl_status st;
  if ((st = fcl_naive_pack(c, q, buf[FWD_Q], 1, nwait, wait))) return st;
  if (p->paged_kv) {
    if ((st = fcl_pack_paged(c->ctx, c->extra, c->extra_q, k, p->k_scale, p->k_scale_kind, buf[FWD_K], p, nwait,
                             wait)) ||
        (st = fcl_pack_paged(c->ctx, c->extra, c->extra_q, v, p->v_scale, p->v_scale_kind, buf[FWD_V], p, nwait,
                             wait)))
      return st;
  } else if ((st = fcl_naive_pack(c, k, buf[FWD_K], 0, nwait, wait)) ||
             (st = fcl_naive_pack(c, v, buf[FWD_V], 0, nwait, wait)))
    return st;
  fcl_naive_order(c);
  return FLASHCL_SUCCESS;
}

/* S = scale QK^T, P = softmax(S) (dropped), O = PV, then o and lse. */
static flashcl_status fcl_naive_forward_run(const fcl_naive_call *c, const fcl_naive_sizes *z, const cl_mem *buf,
                                            const flashcl_tensor *o, const flashcl_tensor *lse, cl_event *out_event) {
  flashcl_context *ctx = c->ctx;
  const fcl_problem *p = c->p;
  const size_t g = c->g, lq = c->lq, lk = c->lk, d = (size_t)c->d, dv = (size_t)c->dv;
  flashcl_status st;
  if ((st = fcl_gemm(ctx, "S = QK^T", 0, 1, g * lq, lk, d, p->scale, buf[FWD_Q], d, g * lq * d, buf[FWD_K], d,
                     lk * d, buf[FWD_S], lk, g * lq * lk, c->groups)))
    return st;
  fcl_naive_order(c);

  if ((st = fcl_softmax(ctx, c->soft, buf[FWD_S], buf[FWD_LSE], p, c->cu_q, c->cu_k, c->tq, c->tk, c->wg, z->lse)))
    return st;
  fcl_naive_order(c);
  if (p->dropout) {
    if ((st = fcl_dropout_apply(ctx, c->src, c->opts, buf[FWD_S], buf[FWD_S], p))) return st;
    fcl_naive_order(c);
  }

  if ((st = fcl_gemm(ctx, "O = PV", 0, 0, g * lq, dv, lk, 1.0f, buf[FWD_S], lk, g * lq * lk, buf[FWD_V], dv,
                     lk * dv, buf[FWD_Q], dv, g * lq * dv, c->groups)))
    return st;
  fcl_naive_order(c);

  return fcl_naive_unpack(c, buf[FWD_Q], buf[FWD_LSE], o, lse, 1, out_event);
}

flashcl_status fcl_naive_forward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                 const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                 const flashcl_tensor *o, const flashcl_tensor *lse, cl_uint nwait,
                                 const cl_event *wait, cl_event *out_event) {
  fcl_naive_sizes z;
  size_t total_bytes;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &total_bytes);
  if (st != FLASHCL_SUCCESS) return st;
  if ((st = fcl_naive_fits(ctx, &z, total_bytes, 0))) return st;
  fcl_naive_call c = {.ctx = ctx, .p = p};
  if ((st = fcl_naive_kernels(&c, p->paged_kv ? "naive_pack_paged" : NULL))) return st;

  cl_mem buf[FWD_NBUF] = {NULL, NULL, NULL, NULL, NULL};
  const size_t counts[FWD_NBUF] = {fcl_size_max(z.q, z.o), z.kv, z.v, z.s, z.lse};
  if (!(st = fcl_naive_alloc(ctx, buf, counts, FWD_NBUF, -1, "allocating the naive workspace"))) {
    fcl_naive_layout(&c, desc, q, k);
    if (!(st = fcl_naive_forward_pack(&c, q, k, v, buf, nwait, wait)))
      st = fcl_naive_forward_run(&c, &z, buf, o, lse, out_event);
  }
  /* Released objects live until the commands using them finish. */
  for (int i = 0; i < FWD_NBUF; i++)
    if (buf[i]) clReleaseMemObject(buf[i]);
  return st;
}

flashcl_status fcl_naive_backward_workspace(flashcl_context *ctx, const fcl_problem *p, size_t *bytes) {
  fcl_naive_sizes z;
  size_t fwd, t;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &fwd);
  if (st != FLASHCL_SUCCESS) return st;
  /* The buffers of fcl_naive_backward: Q, K, V (then dK: the larger of the two
   * head dims), dO, O (then dQ: likewise), P, dP, dV and the LSE scratch, and
   * with softcap a copy of the scaled scores (for the tanh derivative). Over
   * the forward's figure that is Q, dO and K-or-V more, and dP (below). */
  const size_t more = z.q + z.o + fcl_size_max(z.kv, z.v);
  if (!fcl_add_size(fwd, more * sizeof(float), &t) ||
      !fcl_mul_size(z.s, (p->softcap > 0.0f ? 2 : 1) * sizeof(float), bytes) || !fcl_add_size(t, *bytes, bytes))
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "naive backward workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}


enum { BWD_Q, BWD_K, BWD_V, BWD_DO, BWD_O, BWD_P, BWD_DP, BWD_DV, BWD_LSE, BWD_RAW, BWD_NBUF };

/* Q, K, V, dO and O in dense fp32, after the caller's wait list. */
static flashcl_status fcl_naive_backward_pack(const fcl_naive_call *c, const flashcl_tensor *q,
                                              const flashcl_tensor *k, const flashcl_tensor *v,
                                              const flashcl_tensor *d_o, const flashcl_tensor *o, const cl_mem *buf,
                                              cl_uint nwait, const cl_event *wait) {
  flashcl_status st;
  if ((st = fcl_naive_pack(c, q, buf[BWD_Q], 1, nwait, wait)) ||
      (st = fcl_naive_pack(c, k, buf[BWD_K], 0, nwait, wait)) ||
      (st = fcl_naive_pack(c, v, buf[BWD_V], 0, nwait, wait)) ||
      (st = fcl_naive_pack(c, d_o, buf[BWD_DO], 1, nwait, wait)) ||
      (st = fcl_naive_pack(c, o, buf[BWD_O], 1, nwait, wait)))
    return st;
  fcl_naive_order(c);
  return FLASHCL_SUCCESS;
}

/* P rebuilt: S = scale QK^T (a copy kept for softcap's tanh derivative),
 * softmax, and with dropout the dropped P staged in dP's buffer for dV. */
static flashcl_status fcl_naive_backward_probs(const fcl_naive_call *c, const fcl_naive_sizes *z, const cl_mem *buf) {
  flashcl_context *ctx = c->ctx;
  const fcl_problem *p = c->p;
  const size_t gq = c->g * c->lq, lk = c->lk, d = (size_t)c->d;
  flashcl_status st;
  if ((st = fcl_gemm(ctx, "S = QK^T", 0, 1, gq, lk, d, p->scale, buf[BWD_Q], d, gq * d, buf[BWD_K], d, lk * d,
                     buf[BWD_P], lk, gq * lk, c->groups)))
    return st;
  fcl_naive_order(c);
  if (p->softcap > 0.0f) {
    cl_int err = clEnqueueCopyBuffer(ctx->queue, buf[BWD_P], buf[BWD_RAW], 0, 0, z->s * sizeof(float), 0, NULL, NULL);
    if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueCopyBuffer(scores)");
    fcl_naive_order(c);
  }
  if ((st = fcl_softmax(ctx, c->soft, buf[BWD_P], buf[BWD_LSE], p, c->cu_q, c->cu_k, c->tq, c->tk, c->wg, z->lse)))
    return st;
  fcl_naive_order(c);
  if (p->dropout) {
    if ((st = fcl_dropout_apply(ctx, c->src, c->opts, buf[BWD_P], buf[BWD_DP], p))) return st;
    fcl_naive_order(c);
  }
  return FLASHCL_SUCCESS;
}

/* dS = P * (dP - D) (naive_ds), in place of dP. */
static flashcl_status fcl_naive_ds(const fcl_naive_call *c, const fcl_naive_sizes *z, const cl_mem *buf) {
  const fcl_problem *p = c->p;
  fcl_args a = {c->extra, 0, CL_SUCCESS};
  fcl_arg_mem(&a, buf[BWD_P]);
  fcl_arg_mem(&a, buf[BWD_DP]);
  fcl_arg_mem(&a, buf[BWD_O]);
  fcl_arg_mem(&a, buf[BWD_DO]);
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->seqlen_k);
  fcl_arg_float(&a, p->scale);
  fcl_arg_dropout(&a, p);
  fcl_arg_mem(&a, buf[BWD_RAW]);
  fcl_arg_float(&a, p->softcap);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(c->ctx, a.err, "clSetKernelArg(naive_ds)");
  return fcl_enqueue(c->ctx, c->extra, z->lse * (size_t)c->wg, 1, 1, (size_t)c->wg, 0, NULL, NULL,
                     "enqueue naive_ds");
}

/* dV = P^T dO, dP = dO V^T, dS, then dQ = dS K into O's copy and dK = dS^T Q
 * into V's copy (neither is read again). */
static flashcl_status fcl_naive_backward_grads(const fcl_naive_call *c, const fcl_naive_sizes *z, const cl_mem *buf) {
  flashcl_context *ctx = c->ctx;
  const fcl_problem *p = c->p;
  const size_t gq = c->g * c->lq, lk = c->lk, d = (size_t)c->d, dv = (size_t)c->dv, groups = c->groups;
  flashcl_status st;
  if ((st = fcl_gemm(ctx, "dV = P^T dO", 1, 0, lk, dv, gq, 1.0f, buf[p->dropout ? BWD_DP : BWD_P], lk, gq * lk,
                     buf[BWD_DO], dv, gq * dv, buf[BWD_DV], dv, lk * dv, groups)))
    return st;
  /* With dropout dV read dP's buffer, which dP = dO V^T now overwrites. */
  if (p->dropout) fcl_naive_order(c);
  if ((st = fcl_gemm(ctx, "dP = dO V^T", 0, 1, gq, lk, dv, 1.0f, buf[BWD_DO], dv, gq * dv, buf[BWD_V], dv, lk * dv,
                     buf[BWD_DP], lk, gq * lk, groups)))
    return st;
  fcl_naive_order(c);
  if ((st = fcl_naive_ds(c, z, buf))) return st;
  fcl_naive_order(c);
  if ((st = fcl_gemm(ctx, "dQ = dS K", 0, 0, gq, d, lk, 1.0f, buf[BWD_DP], lk, gq * lk, buf[BWD_K], d, lk * d,
                     buf[BWD_O], d, gq * d, groups)) ||
      (st = fcl_gemm(ctx, "dK = dS^T Q", 1, 0, lk, d, gq, 1.0f, buf[BWD_DP], lk, gq * lk, buf[BWD_Q], d, gq * d,
                     buf[BWD_V], d, lk * d, groups)))
    return st;
  fcl_naive_order(c);
  return FLASHCL_SUCCESS;
}

/* dq, dk and dv into the caller's tensors, then the caller's event. */
static flashcl_status fcl_naive_backward_store(const fcl_naive_call *c, const cl_mem *buf, const flashcl_tensor *dq,
                                               const flashcl_tensor *dk, const flashcl_tensor *dv,
                                               cl_event *out_event) {
  flashcl_status st;
  if ((st = fcl_naive_unpack(c, buf[BWD_O], buf[BWD_LSE], dq, NULL, 1, NULL)) ||
      (st = fcl_naive_unpack(c, buf[BWD_V], buf[BWD_LSE], dk, NULL, 0, NULL)) ||
      (st = fcl_naive_unpack(c, buf[BWD_DV], buf[BWD_LSE], dv, NULL, 0, NULL)))
    return st;
  if (out_event) {
    cl_int err = clEnqueueBarrierWithWaitList(c->ctx->queue, 0, NULL, out_event);
    if (err != CL_SUCCESS && fcl_retry_after_flush(c->ctx, NULL, err, "clEnqueueBarrierWithWaitList"))
      err = clEnqueueBarrierWithWaitList(c->ctx->queue, 0, NULL, out_event);
    if (err != CL_SUCCESS) st = fcl_cl_fail(c->ctx, err, "clEnqueueBarrierWithWaitList");
  }
  return st;
}

/* Standard attention backward (Algorithm 3): P is rebuilt with GEMM + softmax,
 * then dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = dS K, dK = dS^T Q, with
 * the N x N matrices P and dP in device memory. GQA groups are tall matrices, so
 * the GEMMs over a group already sum dK and dV over its query heads. */
flashcl_status fcl_naive_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                  const flashcl_tensor *o, const flashcl_tensor *lse, const flashcl_tensor *d_o,
                                  const flashcl_tensor *dq, const flashcl_tensor *dk, const flashcl_tensor *dv,
                                  cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  (void)lse; /* P is rebuilt by the softmax kernel, which recomputes the row statistics */
  fcl_naive_sizes z;
  size_t total_bytes;
  flashcl_status st = fcl_naive_sizes_of(ctx, p, &z, &total_bytes);
  if (st != FLASHCL_SUCCESS) return st;
  if ((st = fcl_naive_backward_workspace(ctx, p, &total_bytes))) return st;
  if ((st = fcl_naive_fits(ctx, &z, total_bytes, 1))) return st;
  fcl_naive_call c = {.ctx = ctx, .p = p};
  if ((st = fcl_naive_kernels(&c, "naive_ds"))) return st;

  cl_mem buf[BWD_NBUF] = {0};
  const size_t counts[BWD_NBUF] = {z.q, z.kv, fcl_size_max(z.kv, z.v), z.o, fcl_size_max(z.q, z.o), z.s, z.s,
                                   z.v, z.lse, z.s};
  const int skip = p->softcap > 0.0f ? -1 : BWD_RAW; /* the raw scores only serve softcap */
  if (!(st = fcl_naive_alloc(ctx, buf, counts, BWD_NBUF, skip, "allocating the naive backward workspace"))) {
    fcl_naive_layout(&c, desc, q, k);
    if (!(st = fcl_naive_backward_pack(&c, q, k, v, d_o, o, buf, nwait, wait)) &&
        !(st = fcl_naive_backward_probs(&c, &z, buf)) && !(st = fcl_naive_backward_grads(&c, &z, buf)))
      st = fcl_naive_backward_store(&c, buf, dq, dk, dv, out_event);
  }
  for (int i = 0; i < BWD_NBUF; i++)
    if (buf[i]) clReleaseMemObject(buf[i]);
  return st;
}
