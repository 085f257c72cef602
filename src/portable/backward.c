/* The flash backward path.
 *
 * Flash backward runs three kernels: D = rowsum(dO * O) (which also zeroes the
 * atomic-mode dQ accumulator), then dK/dV with K/V
 * resident, then dQ with Q resident (deterministic mode) or, in atomic mode, dQ
 * accumulated in fp32 by the dK/dV kernel and converted at the end. Scratch is
 * O(N): D, plus the fp32 dQ accumulator in atomic mode (or its splits, a
 * device-dependent number of copies, in the tensor-core deterministic mode).
 *
 * On NVIDIA devices that passed the tensor-core probe (src/nvidia/mma_probe.c), the
 * dK/dV and dQ kernels are the mma.sync ones of cl/nvidia/flash_bwd_mma.cl
 * (src/nvidia/mma_backward.c) whenever the problem is covered; D, the scratch and the
 * atomic-mode dQ conversion stay the same.
 *
 * In deterministic mode the dK/dV and dQ kernels are independent (neither
 * reads the other's output; both read D): on GPUs dQ goes to a second queue
 * of the context so that they overlap, and a barrier on the caller's queue
 * joins them. On the tensor-core path, where the device can be filled that way,
 * deterministic mode instead has the dK/dV kernel accumulate dQ into split
 * accumulators with one writer per element (DQ_SPLITS in cl/nvidia/flash_bwd_mma.cl),
 * converted like the atomic one: the same bits on every run, at the atomic
 * mode's arithmetic plus `splits` accumulators rather than a second pass over
 * K and V.
 *
 * Every choice of the portable kernels is a parameter of the bwd tuning
 * (src/core/tuning_space.c), read by the functions below with the default rule each
 * one states; the choices measured on the H100 are its built-in tuning file
 * (tuning/nvidia-h100.tune). With verbose >= 2 the portable kernels' build log
 * and resource figures go to stderr at each launch set-up (with the build
 * option -cl-nv-verbose on NVIDIA: registers). */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "core/tuning.h"
#include "nvidia/nvidia.h"
#include "portable/portable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fcl_bwd_sizes {
  size_t dsum;   /* floats of D */
  size_t dq_acc; /* floats of the fp32 dQ accumulators (0 with the separate dQ kernel) */
} fcl_bwd_sizes;

/* How dQ is made. atomic: desc->backward.deterministic == 0, and on return whether the
 * atomic dQ runs; *splits: the accumulator copies the dK/dV kernel fills (1 in
 * atomic mode; in deterministic mode on the tensor-core path, the split count
 * of src/nvidia/mma_backward.c; 0 when the separate dQ kernel runs). */
static void fcl_bwd_mode(flashcl_context *ctx, const fcl_problem *p, const fcl_tuned *tu, int use_mma, int *atomic,
                         int *splits) {
  /* deterministic = 0 permits the atomic dQ; where the tensor-core atomic dQ tile
   * does not divide the head dim, the tensor-core deterministic kernels run (faster
   * than the portable ones, and bit-reproducible). */
  if (use_mma && *atomic && !fcl_mma_bwd_covered(ctx, p, tu, 1)) {
    fcl_log(ctx, "tensor-core atomic dQ has no tile for head_dim %d: running the deterministic dQ kernel",
            p->head_dim);
    *atomic = 0;
  }
  /* ... and where the deterministic kernels are the faster ones (mma_bwd
   * atomic_dq, src/nvidia/mma_bwd_plan.c's rule). */
  if (use_mma && *atomic && !fcl_tuned_get(tu, FCL_MMAB_ATOMIC_DQ, fcl_mma_bwd_atomic_rule(ctx, p, tu))) {
    fcl_log(ctx, "mma_bwd atomic_dq = 0 (%s): the deterministic dQ kernels run", tu->origin);
    *atomic = 0;
  }
  *splits = *atomic ? 1 : use_mma ? fcl_mma_bwd_dq_splits(ctx, p, tu) : 0;
}

static flashcl_status fcl_bwd_sizes_of(flashcl_context *ctx, const fcl_problem *p, int splits, fcl_bwd_sizes *z,
                                       size_t *bytes) {
  size_t t;
  int ok = fcl_mul_size((size_t)p->batch * (size_t)p->heads_q, (size_t)p->seqlen_q, &z->dsum);
  z->dq_acc = 0;
  if (splits) ok = ok && fcl_mul_size(z->dsum, (size_t)p->head_dim, &t) && fcl_mul_size(t, (size_t)splits, &z->dq_acc);
  ok = ok && fcl_add_size(z->dsum, z->dq_acc, &t) && fcl_mul_size(t, sizeof(float), bytes);
  if (!ok) return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "backward workspace size overflows size_t");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_flash_backward_workspace(flashcl_context *ctx, const fcl_problem *p, int atomic,
                                            const fcl_tuned *tu, size_t *bytes) {
  fcl_bwd_sizes z;
  int splits;
  fcl_bwd_mode(ctx, p, tu, tu && tu->family == FLASHCL_TUNE_MMA_BWD, &atomic, &splits);
  return fcl_bwd_sizes_of(ctx, p, splits, &z, bytes);
}

/* The arguments bwd_dkdv and bwd_dq share after their tensors and scratch. */
static void fcl_bwd_shared_args(fcl_args *a, const fcl_problem *p, int group, cl_mem cu_q, cl_mem cu_k, int tq,
                                int tk) {
  fcl_arg_int(a, p->seqlen_q);
  fcl_arg_int(a, p->seqlen_k);
  fcl_arg_int(a, p->heads_q);
  fcl_arg_int(a, group);
  fcl_arg_float(a, p->scale);
  fcl_arg_mem(a, cu_q);
  fcl_arg_mem(a, cu_k);
  fcl_arg_int(a, tq);
  fcl_arg_int(a, tk);
  fcl_arg_dropout(a, p);
  fcl_arg_variants(a, p);
  if (p->mask_kind) fcl_arg_mask(a, p); /* only built with -DMASK */
}

/* The portable kernels' build switches for one plan, from the bwd tuning.
 * Rules where the tuning says nothing: ahead, unroll and ftz 0; red (four
 * floats per red.global.add.v4.f32, inline PTX) where the device is sm_90 or
 * newer and passed the tensor-core probe; shfl (phase A halves as warp halves
 * swapping S and dP through shfl.sync) and nbar (the dP half makes dS behind a
 * named barrier) 0, and never where the PTX, the plan or the problem does not
 * allow them: shfl needs the halves on whole warps and an even A_TN; nbar the
 * work-group halves on whole warps, no warp halves, no softcap (whose dS
 * factor only the S half knows) and no dropout (slower with it on the H100;
 * BENCHMARKS.md). */
typedef struct fcl_bwd_switches {
  int ahead, red, unroll, ftz, shfl, nbar;
} fcl_bwd_switches;

static fcl_bwd_switches fcl_bwd_switches_of(flashcl_context *ctx, const fcl_tuned *tu, const fcl_problem *p,
                                            const fcl_bwd_plan *bp, int acc_dq) {
  fcl_bwd_switches w;
  const int ptx = bp->split && fcl_tuned_get(tu, FCL_BWD_SHFL, 0) + fcl_tuned_get(tu, FCL_BWD_NBAR, 0) > 0 &&
                  fcl_mma_available(ctx);
  w.ahead = fcl_tuned_get(tu, FCL_BWD_AHEAD, 0);
  w.unroll = fcl_tuned_get(tu, FCL_BWD_UNROLL, 0);
  w.ftz = fcl_tuned_get(tu, FCL_BWD_FTZ, 0);
  w.red = acc_dq && fcl_tuned_get(tu, FCL_BWD_RED, 1) && fcl_mma_available(ctx) && ctx->mma_cc >= 90;
  w.shfl = ptx && fcl_tuned_get(tu, FCL_BWD_SHFL, 0) && bp->threads % 32 == 0 && bp->a_tn % 2 == 0;
  w.nbar = ptx && !w.shfl && fcl_tuned_get(tu, FCL_BWD_NBAR, 0) && (bp->threads / 2) % 32 == 0 &&
           !(p->softcap > 0.0f) && !p->dropout;
  return w;
}

/* The build options of the portable backward kernels for one plan. */
static void fcl_bwd_options(flashcl_context *ctx, const fcl_tuned *tu, const fcl_problem *p, const fcl_bwd_plan *bp,
                            int acc_dq, int dq_vec, int vec_aligned, char *opts, size_t size) {
  char variants[128];
  fcl_variant_options(p, variants, sizeof variants);
  const char *extra = ctx->build_options;
  const fcl_bwd_switches w = fcl_bwd_switches_of(ctx, tu, p, bp, acc_dq);
  snprintf(opts, size,
           "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DBLOCK_R=%d -DBLOCK_C=%d -DNTHREADS=%d -DA_TM=%d -DA_TN=%d "
           "-DB_TM=%d -DB_TD=%d -DQA_TM=%d -DQA_TN=%d -DQB_TM=%d -DQB_TD=%d -DCAUSAL=%d -DVARLEN=%d -DATOMIC_DQ=%d "
           "-DDQ_VEC=%d -DDROPOUT=%d -DBWD_AHEAD=%d -DVEC_ALIGNED=%d -DSCORE_PAD=%d -DA_WQ=%d -DB_WX=%d -DQA_WK=%d "
           "-DQB_WX=%d -DNV_RED=%d -DBWD_SPLIT=%d -DBWD_SHFL=%d -DBWD_NBAR=%d -DBWD_UNROLL=%d%s%s%s%s%s",
           (int)p->dtype, p->head_dim, bp->br, bp->bc, bp->threads, bp->a_tm, bp->a_tn, bp->b_tm, bp->b_td,
           bp->qa_tm, bp->qa_tn, bp->qb_tm, bp->qb_td, p->causal && !p->window, p->varlen, acc_dq, dq_vec,
           p->dropout, w.ahead, vec_aligned, bp->pad, bp->a_wq, bp->b_wx, bp->qa_wk, bp->qb_wx, w.red, bp->split,
           w.shfl, w.nbar, w.unroll, w.ftz ? " -cl-denorms-are-zero" : "",
           fcl_mma_available(ctx) ? " -DWARP_PTX=1" : "", variants, extra ? " " : "", extra ? extra : "");
}

/* Everything a backward call runs, decided before anything is enqueued. */
typedef struct fcl_bwd_run {
  int use_mma, atomic, splits, acc_dq, concurrent;
  fcl_bwd_plan bp, bq; /* bwd_dkdv's and bwd_dq's (bq only where bwd_dq runs) */
  const fcl_tuned *knobs;
  fcl_tuned rules;
} fcl_bwd_run;

/* Records the portable family's values as they will run. The knobs of the
 * kernel a dQ mode does not run (dq_*, concurrent with the atomic dQ; red with
 * the separate dQ kernel) are recorded as configured. */
static void fcl_bwd_record(flashcl_context *ctx, const fcl_problem *p, fcl_bwd_run *r, fcl_tuned *tu) {
  const fcl_bwd_switches w = fcl_bwd_switches_of(ctx, r->knobs, p, &r->bp, r->acc_dq);
  const int a = r->acc_dq;
  const int ran[FCL_BWD_COUNT] = {r->bp.bc, r->bp.br, r->bp.threads,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_BC, r->bp.bc) : r->bq.bc,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_BR, r->bp.br) : r->bq.br,
                                  a ? fcl_tuned_get(tu, FCL_BWD_DQ_THREADS, r->bp.threads) : r->bq.threads,
                                  r->bp.pad > 0, r->bp.split, w.unroll, w.ftz, w.ahead,
                                  a ? w.red : fcl_tuned_get(tu, FCL_BWD_RED, w.red), w.shfl, w.nbar, r->concurrent};
  for (int i = 0; i < FCL_BWD_COUNT; i++) fcl_tuned_ran(tu, i, ran[i]);
}

/* The head dim the portable backward's tiles are planned for: the larger of
 * q/k's and v/o's (cl/portable/flash_bwd.cl's DM, every local tile's rows). */
static int fcl_bwd_tile_dim(const fcl_problem *p) {
  return p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
}

static flashcl_status fcl_bwd_prepare(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                      fcl_tuned *tu, fcl_bwd_run *r) {
  r->use_mma = tu->family == FLASHCL_TUNE_MMA_BWD;
  r->atomic = !desc->backward.deterministic;
  fcl_bwd_mode(ctx, p, tu, r->use_mma, &r->atomic, &r->splits);
  r->acc_dq = r->splits > 0;
  r->knobs = fcl_bwd_knobs(tu, &r->rules);
  memset(&r->bq, 0, sizeof r->bq);
  const int dm = fcl_bwd_tile_dim(p);
  int ok = fcl_bwd_make_plan(ctx, r->knobs, dm, 0, &r->bp) &&
           (r->acc_dq || r->use_mma ? (r->bq = r->bp, 1) : fcl_bwd_make_plan(ctx, r->knobs, dm, 1, &r->bq));
  if (!ok && r->knobs == tu && tu->source != FLASHCL_TUNING_SOURCE_DEFAULT) {
    if (tu->source == FLASHCL_TUNING_SOURCE_CALL)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "bwd tuning refused: its tiles for head_dim %d do not fit %zu "
                      "bytes of local memory or map to the work-items", dm, fcl_local_budget(ctx));
    fcl_log(ctx, "bwd tuning from %s ignored (its tiles do not fit or map): the default rule runs", tu->origin);
    memset(tu->set, 0, sizeof tu->set);
    memset(tu->call, 0, sizeof tu->call);
    tu->source = FLASHCL_TUNING_SOURCE_DEFAULT;
    ok = fcl_bwd_make_plan(ctx, r->knobs, dm, 0, &r->bp) &&
         (r->acc_dq || r->use_mma ? (r->bq = r->bp, 1) : fcl_bwd_make_plan(ctx, r->knobs, dm, 1, &r->bq));
  }
  if (!ok)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "backward tiles for head_dim %d do not fit in %zu bytes of local memory",
                    dm, fcl_local_budget(ctx));
  /* On a GPU each kernel ends in a partly filled wave that the other can fill;
   * on a CPU device both would only compete for the same cores. */
  r->concurrent = fcl_tuned_get(r->knobs, FCL_BWD_CONCURRENT, ctx->info.is_gpu);
  if (r->use_mma) {
    flashcl_config unused;
    return fcl_mma_bwd_report(ctx, p, r->atomic, r->splits, tu, &unused);
  }
  fcl_bwd_record(ctx, p, r, tu);
  return fcl_tuned_honoured(ctx, tu);
}

flashcl_status fcl_bwd_config(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                              fcl_tuned *tu, flashcl_config *c) {
  fcl_bwd_run r;
  flashcl_status st = fcl_bwd_prepare(ctx, p, desc, tu, &r);
  if (st != FLASHCL_SUCCESS) return st;
  if (r.use_mma) return fcl_mma_bwd_report(ctx, p, r.atomic, r.splits, tu, c);
  fcl_tuned_report(tu, c);
  snprintf(c->kernel, sizeof c->kernel, "bwd_dkdv");
  c->block_r = r.bp.br;
  c->block_c = r.bp.bc;
  c->threads = r.bp.threads;
  c->local_bytes = fcl_bwd_local_bytes(r.bp.br, r.bp.bc, fcl_bwd_tile_dim(p), r.bp.pad);
  return FLASHCL_SUCCESS;
}

/* The caller's tensors of one backward call. */
typedef struct fcl_bwd_io {
  const flashcl_tensor *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
} fcl_bwd_io;

/* What the stages of one backward launch share. */
typedef struct fcl_bwd_launch {
  flashcl_context *ctx;
  const fcl_problem *p;
  const flashcl_attention_desc *desc;
  const fcl_bwd_run *r;
  fcl_bwd_io t;
  cl_kernel pre, dkdv, dq; /* dq: bwd_dq_store where acc_dq, else the dQ kernel */
  fcl_mma_bwd_launch mma;
  cl_mem dsum, acc; /* D, and the fp32 dQ accumulator(s) where acc_dq */
  cl_mem cu_q, cu_k;
  int tq, tk, group;
} fcl_bwd_launch;

/* Every portable kernel must take its planned work-group before anything is
 * enqueued, so that a refusal never leaves dK/dV written and dQ not. */
static flashcl_status fcl_bwd_check_work_groups(const fcl_bwd_launch *L) {
  const fcl_bwd_run *r = L->r;
  const int use_mma = r->use_mma, acc_dq = r->acc_dq;
  const cl_kernel ks[3] = {L->pre, use_mma ? NULL : L->dkdv, use_mma && !acc_dq ? NULL : L->dq};
  static const char *kn[3] = {"bwd_preprocess", "bwd_dkdv", "bwd_dq"};
  const size_t want[3] = {64, (size_t)r->bp.threads, acc_dq ? 0 : (size_t)r->bq.threads};
  for (int i = 0; i < 3; i++) {
    size_t kwg = 0;
    if (ks[i] && want[i] &&
        clGetKernelWorkGroupInfo(ks[i], L->ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
            CL_SUCCESS &&
        kwg < want[i])
      return fcl_fail(L->ctx, FLASHCL_ERROR_UNSUPPORTED,
                      "%s needs %zu work-items per work-group but the compiled kernel allows %zu", kn[i], want[i],
                      kwg);
  }
  return FLASHCL_SUCCESS;
}

/* Builds (or finds) the call's kernels: the portable preprocess and, in
 * atomic or split mode, dQ store beside either family's dK/dV and dQ. */
static flashcl_status fcl_bwd_get_kernels(fcl_bwd_launch *L, fcl_tuned *tu) {
  flashcl_context *ctx = L->ctx;
  const fcl_problem *p = L->p;
  const fcl_bwd_run *r = L->r;
  const fcl_bwd_io *t = &L->t;
  const int acc_dq = r->acc_dq;
  char opts[1024], opts_dq[1024];
  const int vec = fcl_vec_aligned(t->q) && fcl_vec_aligned(t->k) && fcl_vec_aligned(t->v) && fcl_vec_aligned(t->d_o);
  fcl_bwd_options(ctx, r->knobs, p, &r->bp, acc_dq, acc_dq && fcl_rows_aligned16(t->dq), vec, opts, sizeof opts);
  fcl_bwd_options(ctx, r->knobs, p, &r->bq, acc_dq, acc_dq && fcl_rows_aligned16(t->dq), vec, opts_dq,
                  sizeof opts_dq);
  /* Dropout and masks bring their helper files into the program, and where
   * the PTX route passed its probe the NVIDIA switches (red, shfl, nbar) theirs. */
  char src[192];
  snprintf(src, sizeof src, "%s%s%sdtype.cl+seq_bounds.cl+score_variant.cl+flash_bwd.cl",
           fcl_mma_available(ctx) ? "warp_ptx.cl+" : "", p->dropout ? "philox.cl+" : "", p->mask_kind ? "mask.cl+" : "");
  flashcl_status st;
  L->dkdv = L->dq = NULL;
  if ((st = fcl_get_kernel(ctx, src, opts, "bwd_preprocess", &L->pre)) ||
      (acc_dq && (st = fcl_get_kernel(ctx, src, opts, "bwd_dq_store", &L->dq))))
    return st;
  if (r->use_mma) {
    if ((st = fcl_mma_backward_kernels(ctx, p, tu, r->atomic, r->atomic ? 0 : r->splits, &L->mma))) return st;
    L->dkdv = L->mma.dkdv;
    if (!acc_dq) L->dq = L->mma.dq;
  } else if ((st = fcl_get_kernel(ctx, src, opts, "bwd_dkdv", &L->dkdv)) ||
             (!acc_dq && (st = fcl_get_kernel(ctx, src, opts_dq, "bwd_dq", &L->dq)))) {
    return st;
  }
  if (!r->use_mma && ctx->verbose >= 2) {
    fcl_print_build_log(ctx, L->dkdv, "bwd_dkdv", opts);
    if (!acc_dq) fcl_print_build_log(ctx, L->dq, "bwd_dq", opts_dq);
  }
  return fcl_bwd_check_work_groups(L);
}

/* D, and the dQ accumulator(s) where acc_dq; nothing is left allocated on failure. */
static flashcl_status fcl_bwd_alloc(fcl_bwd_launch *L, const fcl_bwd_sizes *z) {
  flashcl_context *ctx = L->ctx;
  cl_int err;
  L->acc = NULL;
  L->dsum = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, z->dsum * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "allocating the backward scratch (D)");
  if (L->r->acc_dq) {
    L->acc = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, z->dq_acc * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
      clReleaseMemObject(L->dsum);
      return fcl_cl_fail(ctx, err, "allocating the backward scratch (dQ accumulator)");
    }
  }
  return FLASHCL_SUCCESS;
}

/* D = rowsum(dO * O), after the caller's wait list; *pre_done is set once enqueued. */
static flashcl_status fcl_bwd_preprocess(const fcl_bwd_launch *L, cl_uint nwait, const cl_event *wait,
                                         cl_event *pre_done) {
  flashcl_context *ctx = L->ctx;
  const fcl_problem *p = L->p;
  fcl_args a = {L->pre, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, L->t.o);
  fcl_arg_tensor(&a, L->t.d_o);
  fcl_arg_mem(&a, L->dsum);
  fcl_arg_mem(&a, L->acc); /* zeroed by the preprocess (every split) */
  fcl_arg_int(&a, p->seqlen_q);
  fcl_arg_int(&a, p->heads_q);
  fcl_arg_mem(&a, L->cu_q);
  fcl_arg_int(&a, L->tq);
  fcl_arg_int(&a, L->r->splits);
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(bwd_preprocess)");
  /* cl/portable/flash_bwd.cl bwd_preprocess: 64 work-items, HEAD_DIM_V / 8 per row. */
  const size_t pre_rows = (size_t)(64 / (p->head_dim_v / 8));
  size_t g_pre[3] = {((size_t)p->seqlen_q + pre_rows - 1) / pre_rows * 64, (size_t)p->heads_q, (size_t)p->batch};
  size_t l_pre[3] = {64, 1, 1};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, L->pre, 3, NULL, g_pre, l_pre, nwait, nwait ? wait : NULL, pre_done);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "enqueue bwd_preprocess");
  return FLASHCL_SUCCESS;
}

/* dK and dV (either family) after D. *side: the queue dQ will run on beside
 * it (NULL: the caller's); *dkdv_done is made only where something waits on
 * it (the dQ store, or the join of a side-queue dQ). */
static flashcl_status fcl_bwd_dkdv(const fcl_bwd_launch *L, cl_event pre_done, cl_command_queue *side,
                                   cl_event *dkdv_done) {
  flashcl_context *ctx = L->ctx;
  const fcl_problem *p = L->p;
  const fcl_bwd_run *r = L->r;
  const fcl_bwd_io *t = &L->t;
  fcl_args a = {L->dkdv, 0, CL_SUCCESS};
  if (r->use_mma) {
    a.err = fcl_mma_backward_args(&L->mma, p, L->desc, t->q, t->k, t->v, t->lse, t->d_o, t->dq, t->dk, t->dv,
                                  L->dsum, L->acc);
  } else {
    fcl_arg_bwd_dkdv_head(&a, t->q, t->k, t->v, t->d_o, t->dk, t->dv, t->lse, L->dsum, L->acc);
    fcl_bwd_shared_args(&a, p, L->group, L->cu_q, L->cu_k, L->tq, L->tk);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(bwd_dkdv)");
  size_t local[3] = {(size_t)r->bp.threads, 1, 1};
  size_t kblocks = ((size_t)p->seqlen_k + r->bp.bc - 1) / r->bp.bc;
  size_t g_kv[3] = {kblocks * r->bp.threads, (size_t)p->heads_kv, (size_t)p->batch};
  *side = !r->acc_dq && r->concurrent ? fcl_side_queue(ctx) : NULL;
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, L->dkdv, 3, NULL, r->use_mma ? L->mma.global_dkdv : g_kv,
                                      r->use_mma ? L->mma.local_dkdv : local, 1, &pre_done,
                                      r->acc_dq || *side ? dkdv_done : NULL);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "enqueue bwd_dkdv");
  return FLASHCL_SUCCESS;
}

static cl_int fcl_bwd_dq_args(const fcl_bwd_launch *L) {
  const fcl_problem *p = L->p;
  const fcl_bwd_io *t = &L->t;
  fcl_args a = {L->dq, 0, CL_SUCCESS};
  if (L->r->acc_dq) {
    fcl_arg_mem(&a, L->acc);
    fcl_arg_tensor(&a, t->dq);
    fcl_arg_int(&a, p->seqlen_q);
    fcl_arg_int(&a, p->heads_q);
    fcl_arg_mem(&a, L->cu_q);
    fcl_arg_int(&a, L->tq);
    fcl_arg_int(&a, L->r->splits);
  } else if (!L->r->use_mma) { /* bwd_dq_mma got its arguments with bwd_dkdv_mma's */
    fcl_arg_bwd_dq_head(&a, t->q, t->k, t->v, t->d_o, t->dq, t->lse, L->dsum);
    fcl_bwd_shared_args(&a, p, L->group, L->cu_q, L->cu_k, L->tq, L->tk);
  }
  return a.err;
}

/* bwd_dq_store: dQ from the accumulator(s) that dK/dV filled. Takes dkdv_done. */
static cl_int fcl_bwd_dq_store(const fcl_bwd_launch *L, cl_event dkdv_done, cl_event *out_event) {
  const fcl_problem *p = L->p;
  size_t g[3] = {(size_t)p->head_dim / 8, (size_t)p->seqlen_q, (size_t)p->batch * p->heads_q};
  /* The last command must cover dK/dV too: on an out-of-order queue waiting on
   * the dK/dV event is what orders it. */
  cl_int err = clEnqueueNDRangeKernel(L->ctx->queue, L->dq, 3, NULL, g, NULL, 1, &dkdv_done, out_event);
  if (err != CL_SUCCESS && fcl_retry_after_flush(L->ctx, NULL, err, "enqueue bwd_dq_store"))
    err = clEnqueueNDRangeKernel(L->ctx->queue, L->dq, 3, NULL, g, NULL, 1, &dkdv_done, out_event);
  clReleaseEvent(dkdv_done);
  return err;
}

/* The separate dQ kernel (either family) after D, beside dK/dV where side is
 * set. Takes dkdv_done. */
static cl_int fcl_bwd_dq_kernel(const fcl_bwd_launch *L, cl_event pre_done, cl_event dkdv_done,
                                cl_command_queue side, cl_event *out_event) {
  flashcl_context *ctx = L->ctx;
  const fcl_problem *p = L->p;
  const fcl_bwd_plan *bq = &L->r->bq;
  const int use_mma = L->r->use_mma;
  size_t qblocks = ((size_t)p->seqlen_q + bq->br - 1) / bq->br;
  size_t g[3] = {qblocks * bq->threads, (size_t)p->heads_q, (size_t)p->batch};
  size_t local_dq[3] = {(size_t)bq->threads, 1, 1};
  cl_event parts[2] = {NULL, dkdv_done};
  cl_int err;
  /* With a side queue, dQ runs beside dK/dV: the flushes make the events
   * visible across the queues (OpenCL requires it), and the barrier joins dQ
   * back into the caller's queue, so that its later commands and out_event
   * come after all three gradients. */
  if (side && (err = clFlush(ctx->queue)) != CL_SUCCESS) side = NULL;
  for (int again = 0; again < 2; again++) { /* dK/dV is enqueued: one more try (src/core/retry.c) */
    err = clEnqueueNDRangeKernel(side ? side : ctx->queue, L->dq, 3, NULL, use_mma ? L->mma.global_dq : g,
                                 use_mma ? L->mma.local_dq : local_dq, 1, &pre_done, &parts[0]);
    if (err == CL_SUCCESS || again || !fcl_retry_after_flush(ctx, side, err, "enqueue dQ")) break;
  }
  const int dq_on_side = side && err == CL_SUCCESS;
  if (dq_on_side) err = clFlush(side);
  /* Join dQ with dK/dV (enqueued earlier) for the caller's event; the
   * gradients are on their way, so a shortage gets one more try here too. */
  for (int again = 0; err == CL_SUCCESS && (side || out_event) && again < 2; again++) {
    err = side ? clEnqueueBarrierWithWaitList(ctx->queue, 2, parts, out_event)
               : clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, out_event);
    if (err == CL_SUCCESS) break;
    if (again || !fcl_retry_after_flush(ctx, NULL, err, "join of dQ")) break;
    err = CL_SUCCESS;
  }
  /* dQ was enqueued but could not be joined into the caller's queue: finish it
   * here, so that it never writes dq after the caller's next commands. */
  if (err != CL_SUCCESS && dq_on_side) clFinish(side);
  if (parts[0]) clReleaseEvent(parts[0]);
  if (dkdv_done) clReleaseEvent(dkdv_done);
  return err;
}

/* D, then dK/dV, then dQ; every event made here is released here. */
static flashcl_status fcl_bwd_enqueue(const fcl_bwd_launch *L, cl_uint nwait, const cl_event *wait,
                                      cl_event *out_event) {
  cl_event pre_done = NULL; /* D is ready (and the dQ accumulators zeroed) */
  cl_event dkdv_done = NULL;
  cl_command_queue side = NULL;
  /* dQ's arguments first: failing to set them once dK/dV is enqueued would
   * leave dk and dv written by a failed call. */
  cl_int err = fcl_bwd_dq_args(L);
  if (err != CL_SUCCESS) return fcl_cl_fail(L->ctx, err, "clSetKernelArg(dQ)");
  flashcl_status st = fcl_bwd_preprocess(L, nwait, wait, &pre_done);
  if (st == FLASHCL_SUCCESS) st = fcl_bwd_dkdv(L, pre_done, &side, &dkdv_done);
  if (st == FLASHCL_SUCCESS) {
    err = L->r->acc_dq ? fcl_bwd_dq_store(L, dkdv_done, out_event)
                       : fcl_bwd_dq_kernel(L, pre_done, dkdv_done, side, out_event);
    if (err != CL_SUCCESS) st = fcl_cl_fail(L->ctx, err, "enqueue dQ");
  }
  if (pre_done) clReleaseEvent(pre_done);
  return st;
}

flashcl_status fcl_flash_backward(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                  fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                  const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                  const flashcl_tensor *d_o, const flashcl_tensor *dq, const flashcl_tensor *dk,
                                  const flashcl_tensor *dv, cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  fcl_bwd_run r;
  flashcl_status st = fcl_bwd_prepare(ctx, p, desc, tu, &r);
  if (st != FLASHCL_SUCCESS) return st;
  fcl_bwd_sizes z;
  size_t bytes;
  st = fcl_bwd_sizes_of(ctx, p, r.splits, &z, &bytes);
  if (st != FLASHCL_SUCCESS) return st;
  if (bytes > ctx->info.max_mem_alloc_size)
    return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY, "backward scratch of %zu bytes exceeds the device's %llu-byte buffer limit",
                    bytes, (unsigned long long)ctx->info.max_mem_alloc_size);

  fcl_bwd_launch L = {.ctx = ctx, .p = p, .desc = desc, .r = &r, .t = {q, k, v, o, lse, d_o, dq, dk, dv}};
  if ((st = fcl_bwd_get_kernels(&L, tu)) || (st = fcl_bwd_alloc(&L, &z))) return st;
  L.cu_q = p->varlen ? desc->varlen.cu_seqlens_q : NULL;
  L.cu_k = p->varlen ? desc->varlen.cu_seqlens_k : NULL;
  L.tq = (int)q->shape[1];
  L.tk = (int)k->shape[1];
  L.group = p->heads_q / p->heads_kv;
  st = fcl_bwd_enqueue(&L, nwait, wait, out_event);
  if (L.acc) clReleaseMemObject(L.acc);
  clReleaseMemObject(L.dsum);
  return st;
}
