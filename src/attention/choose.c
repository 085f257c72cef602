/* Which kernel family a forward or backward call runs, and its configuration.
 *
 * One chooser for every flash call and for flashcl_attention_config, so that
 * the query reports exactly what the call runs:
 *   1. desc.algorithm.tuning, if any, names the family (fwd / mma_fwd / wgmma_fwd for the
 *      forward, bwd / mma_bwd for the backward), and a family that cannot run
 *      the problem is refused rather than replaced;
 *   2. otherwise desc.algorithm.kernel (and $FLASHCL_KERNEL under AUTO) and the tensor-core
 *      coverage decide, as src/nvidia/mma_forward.c describes, and on Hopper the
 *      wgmma_fwd tuning's `use` with the kernel's own coverage;
 *   3. the family's parameters come from fcl_tuning_resolve (src/core/tuning_db.c),
 *      and desc.algorithm.block_r / block_c set br / bc of the portable families (any
 *      other family refuses them).
 */
#include "core/internal.h"
#include "core/tuning.h"
#include "attention/attention.h"
#include "nvidia/nvidia.h"
#include "portable/portable.h"

#include <stdio.h>

static flashcl_kernel_family fcl_forced_kernel(flashcl_tuning_family want) {
  if (want == FLASHCL_TUNE_NONE) return FLASHCL_KERNEL_AUTO;
  return want == FLASHCL_TUNE_FWD || want == FLASHCL_TUNE_BWD ? FLASHCL_KERNEL_PORTABLE : FLASHCL_KERNEL_NVIDIA_MMA;
}

/* On a device and problem the tensor cores run, whether the Hopper kernel does:
 * 1 and its configuration in *tu, or 0. */
static flashcl_status fcl_choose_wgmma(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                                       flashcl_tuning_family want, const fcl_tune_key *key, fcl_tuned *tu, int *use) {
  *use = 0;
  if (want == FLASHCL_TUNE_MMA_FWD) return FLASHCL_SUCCESS;
  fcl_tuning_resolve(ctx, FLASHCL_TUNE_WGMMA_FWD, want == FLASHCL_TUNE_WGMMA_FWD ? desc->algorithm.tuning : NULL, key, tu);
  *use = fcl_tuned_get(tu, FCL_WG_USE, 1) && fcl_wgmma_covered(ctx, p);
  if (want == FLASHCL_TUNE_WGMMA_FWD && !*use)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.tuning asks for the wgmma forward, which %s",
                    fcl_tuned_get(tu, FCL_WG_USE, 1) ? "does not cover this problem or device (see the verbose log)"
                                                     : "its use = 0 turns off");
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_choose(flashcl_context *ctx, const flashcl_attention_desc *desc, const fcl_problem *p,
                          const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                          const flashcl_tensor *o, const flashcl_tensor *const *grads, flashcl_pass pass,
                          fcl_tuned *tu) {
  flashcl_tuning_family want;
  flashcl_status st = fcl_tuning_call_family(ctx, desc->algorithm.tuning, pass, 0, &want);
  int use_mma = 0;
  if (st || (st = fcl_mma_select(ctx, desc, p, q, k, v, o, pass, fcl_forced_kernel(want), &use_mma))) return st;
  if (pass == FLASHCL_PASS_BACKWARD && use_mma && grads &&
      !(fcl_rows_aligned16(grads[0]) && fcl_rows_aligned16(grads[1]) && fcl_rows_aligned16(grads[2]) &&
        fcl_rows_aligned16(grads[3]))) {
    if (want == FLASHCL_TUNE_MMA_BWD)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.tuning asks for the tensor-core backward, which needs "
                      "16-byte aligned d_o/dq/dk/dv rows");
    fcl_log(ctx, "tensor-core backward needs 16-byte aligned d_o/dq/dk/dv rows: running the portable kernels");
    use_mma = 0;
  }
  const fcl_tune_key key = {p->head_dim, p->dtype, p->causal || p->window,
                            pass == FLASHCL_PASS_BACKWARD ? !desc->backward.deterministic : -1, p->seqlen_k};
  flashcl_tuning_family fam = pass == FLASHCL_PASS_FORWARD ? (use_mma ? FLASHCL_TUNE_MMA_FWD : FLASHCL_TUNE_FWD)
                                                           : (use_mma ? FLASHCL_TUNE_MMA_BWD : FLASHCL_TUNE_BWD);
  int wgmma = 0;
  if (fam == FLASHCL_TUNE_MMA_FWD && (st = fcl_choose_wgmma(ctx, desc, p, want, &key, tu, &wgmma))) return st;
  if (wgmma) fam = FLASHCL_TUNE_WGMMA_FWD;
  else fcl_tuning_resolve(ctx, fam, want == fam ? desc->algorithm.tuning : NULL, &key, tu);
  /* Head dims only the Hopper backward covers, with a tuning that turns it
   * off (mma_bwd wgmma = 0): refused for desc.algorithm.tuning, the portable kernels
   * for a file's entry. */
  if (fam == FLASHCL_TUNE_MMA_BWD && !fcl_mma_bwd_covered(ctx, p, tu, 0)) {
    if (want == FLASHCL_TUNE_MMA_BWD)
      return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.tuning's mma_bwd leaves head_dim %d without a "
                      "tensor-core backward (only the Hopper kernels, which its wgmma = 0 turns off, cover it)",
                      p->head_dim);
    fcl_log(ctx, "mma_bwd tuning from %s leaves head_dim %d without a tensor-core backward: running the portable "
            "kernels", tu->origin, p->head_dim);
    fam = FLASHCL_TUNE_BWD;
    fcl_tuning_resolve(ctx, fam, NULL, &key, tu);
  }
  if (!desc->algorithm.block_r && !desc->algorithm.block_c) return FLASHCL_SUCCESS;
  if (fam != FLASHCL_TUNE_FWD && fam != FLASHCL_TUNE_BWD)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "desc.algorithm.block_r/block_c (%d, %d) apply to the portable kernels, "
                    "but this call runs the %s family: leave them 0, set desc.algorithm.kernel = FLASHCL_KERNEL_PORTABLE, or "
                    "give its tiles through desc.algorithm.tuning", desc->algorithm.block_r, desc->algorithm.block_c,
                    flashcl_tuning_family_name(fam));
  return fcl_tuned_blocks(ctx, tu, desc->algorithm.block_r, desc->algorithm.block_c);
}

flashcl_status fcl_forward_dispatch(flashcl_context *ctx, const fcl_problem *p, const flashcl_attention_desc *desc,
                                    fcl_tuned *tu, const flashcl_tensor *q, const flashcl_tensor *k,
                                    const flashcl_tensor *v, const flashcl_tensor *o, const flashcl_tensor *lse,
                                    cl_uint nwait, const cl_event *wait, cl_event *out_event) {
  if (tu->family == FLASHCL_TUNE_FWD) return fcl_flash_forward(ctx, p, desc, tu, q, k, v, o, lse, nwait, wait, out_event);
  if (tu->family == FLASHCL_TUNE_WGMMA_FWD) {
    const flashcl_status ws = fcl_wgmma_forward(ctx, p, desc, tu, q, k, v, o, lse, nwait, wait, out_event);
    /* The probe builds one variant; a variant that fails to build (or to
     * assemble for sm_90a) turns the path off for the context, and the call
     * runs mma.sync as if wgmma had never been there (unless desc.algorithm.tuning asked
     * for wgmma by name). */
    if (ws != FLASHCL_ERROR_BUILD_FAILED || tu->source == FLASHCL_TUNING_SOURCE_CALL) return ws;
    fcl_wgmma_build_failed(ctx);
    const fcl_tune_key key = {p->head_dim, p->dtype, p->causal || p->window, -1, p->seqlen_k};
    fcl_tuning_resolve(ctx, FLASHCL_TUNE_MMA_FWD, NULL, &key, tu);
  }
  return fcl_mma_forward(ctx, p, desc, tu, q, k, v, o, lse, nwait, wait, out_event);
}

static flashcl_status fcl_attention_config_locked(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                  const flashcl_tensor *q, const flashcl_tensor *k,
                                                  const flashcl_tensor *v, const flashcl_tensor *o, flashcl_pass pass,
                                                  flashcl_config *config) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_attention_desc desc_full;
  flashcl_status imp = fcl_attention_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (!config || !o) return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "config and o must be non-NULL");
  fcl_problem p;
  flashcl_status st = fcl_query_problem(ctx, desc, q, k, v, o, pass, &p);
  if (st != FLASHCL_SUCCESS) return st;
  flashcl_config c;
  memset(&c, 0, sizeof c);
  if (fcl_resolve_algo(ctx, desc) == FLASHCL_ALGO_NAIVE) {
    c.family = FLASHCL_TUNE_NONE;
    flashcl_tuning_init(&c.tuning, FLASHCL_TUNE_NONE);
    snprintf(c.origin, sizeof c.origin, "naive path (no flash kernel)");
    snprintf(c.kernel, sizeof c.kernel, "naive");
    *config = c;
    return FLASHCL_SUCCESS;
  }
  /* The gradients are taken to be laid out like the inputs (see flashcl.h). */
  const flashcl_tensor *grads[4] = {q, q, k, k};
  fcl_tuned tu;
  if ((st = fcl_choose(ctx, desc, &p, q, k, v, o, grads, pass, &tu))) return st;
  switch (tu.family) {
  case FLASHCL_TUNE_FWD: st = fcl_fwd_config(ctx, &p, &tu, &c); break;
  case FLASHCL_TUNE_MMA_FWD: st = fcl_mma_fwd_config(ctx, &p, &tu, &c); break;
  case FLASHCL_TUNE_WGMMA_FWD: st = fcl_wgmma_fwd_config(ctx, &p, &tu, &c); break;
  default: st = fcl_bwd_config(ctx, &p, desc, &tu, &c); break;
  }
  if (st == FLASHCL_SUCCESS) *config = c;
  return st;
}

flashcl_status flashcl_attention_config(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                        const flashcl_tensor *q, const flashcl_tensor *k, const flashcl_tensor *v,
                                        const flashcl_tensor *o, flashcl_pass pass, flashcl_config *config) {
  fcl_enter(ctx);
  const int d0 = ctx ? ctx->probe_defers : 0;
  flashcl_config c;
  flashcl_status st = fcl_attention_config_locked(ctx, desc, q, k, v, o, pass, config ? &c : NULL);
  if ((st = fcl_query_settled(ctx, d0, st)) == FLASHCL_SUCCESS) *config = c;
  return fcl_leave(ctx, st);
}
