/* flashcl_kv_cache_append: new K/V tokens into a paged or contiguous cache
 * (cl/decode/kv_append.cl), quantized on write for an I8 / F8 cache side
 * (kv_append_quant, formats in cl/common/kv_quant.cl). */
#include "core/internal.h"
#include "core/kernel_args.h"
#include "decode/decode.h"

#include <stdio.h>

/* The scale buffers against everything else of the call: a TOKEN or BLOCK32
 * scale is written, so its range must not touch any tensor, the lengths, the block
 * table or the other side's scales; a TENSOR or HEAD scale is read while the
 * caches are written. */
static flashcl_status fcl_append_check_scales(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                              const fcl_kv_info *kv, const flashcl_tensor *const tensors[4],
                                              const fcl_aux *aux, int naux) {
  static const char *const names[4] = {"k_new", "v_new", "k_cache", "v_cache"};
  const fcl_aux sc[2] = {{kv->k_quant ? desc->cache.k_scale : NULL, 0, kv->k_scale_bytes, "desc.cache.k_scale"},
                         {kv->v_quant ? desc->cache.v_scale : NULL, 0, kv->v_scale_bytes, "desc.cache.v_scale"}};
  const int written[2] = {kv->k_scale_kind == FLASHCL_KV_SCALE_TOKEN || kv->k_scale_kind == FLASHCL_KV_SCALE_BLOCK32,
                          kv->v_scale_kind == FLASHCL_KV_SCALE_TOKEN || kv->v_scale_kind == FLASHCL_KV_SCALE_BLOCK32};
  flashcl_status st;
  for (int i = 0; i < 2; i++) {
    if (!sc[i].mem) continue;
    /* Read scales only against the outputs (the caches). */
    const int first = written[i] ? 0 : 2;
    if ((st = fcl_check_aux_buffers(ctx, &sc[i], 1, tensors + first, names + first, 4 - first))) return st;
    if (!written[i]) continue;
    const fcl_aux *others[3] = {&aux[0], naux > 1 ? &aux[1] : NULL, &sc[1 - i]};
    for (int j = 0; j < 3; j++) {
      const fcl_aux *o = others[j];
      if (o && o->mem == sc[i].mem && o->offset < sc[i].offset + sc[i].bytes && sc[i].offset < o->offset + o->bytes)
        return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s (written: TOKEN or BLOCK32 scales) overlaps %s", sc[i].name,
                        o->name);
    }
  }
  return FLASHCL_SUCCESS;
}

/* Everything of an append that is checked before anything is enqueued; fills kv. */
static flashcl_status fcl_append_validate(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                          const flashcl_tensor *k_new, const flashcl_tensor *v_new,
                                          const flashcl_tensor *k_cache, const flashcl_tensor *v_cache, cl_mem seqlens,
                                          fcl_kv_info *kv) {
  flashcl_status st;
  if ((st = fcl_check_tensor(ctx, k_new, "k_new", 1)) || (st = fcl_check_tensor(ctx, v_new, "v_new", 1))) return st;
  for (int i = 0; i < 3; i++)
    if (k_new->shape[i] != v_new->shape[i])
      return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "k_new and v_new must have the same batch, tokens and heads");
  const int batch = (int)k_new->shape[0];
  if ((st = fcl_check_kv_cache(ctx, desc ? &desc->cache : NULL, k_cache, v_cache, batch, kv))) return st;
  const int plain = fcl_kv_plain_dtype(k_cache, v_cache);
  if (k_new->dtype != v_new->dtype || (plain >= 0 && (int)k_new->dtype != plain))
    return fcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH,
                    "k_new, v_new and the plain caches must share one dtype (k_new %s, v_new %s, k_cache %s, "
                    "v_cache %s); a quantized cache takes f32, f16 or bf16",
                    flashcl_dtype_name(k_new->dtype), flashcl_dtype_name(v_new->dtype),
                    flashcl_dtype_name(k_cache->dtype), flashcl_dtype_name(v_cache->dtype));
  if (k_new->shape[2] != kv->heads_kv || k_new->shape[3] != kv->head_dim || v_new->shape[3] != kv->head_dim_v)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                    "k_new / v_new heads and head dims (%lld, %lld / %lld) must match the caches (%d, %d / %d)",
                    (long long)k_new->shape[2], (long long)k_new->shape[3], (long long)v_new->shape[3], kv->heads_kv,
                    kv->head_dim, kv->head_dim_v);
  /* The rule of decode and the forward, the cache's only readers: a cache they
   * would refuse is refused here, before it is filled. */
  if (kv->head_dim % 8 != 0 || kv->head_dim > FCL_DECODE_MAX_HEAD_DIM)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED_HEAD_DIM,
                    "head_dim %d is not supported: it must be a multiple of 8 in [8, %d], as decode needs",
                    kv->head_dim, FCL_DECODE_MAX_HEAD_DIM);
  if ((st = fcl_check_kv_head_dims(ctx, kv->head_dim, kv->head_dim_v))) return st;
  if ((int64_t)k_new->shape[1] * kv->heads_kv > 0x7fffffff)
    return fcl_fail(ctx, FLASHCL_ERROR_OVERFLOW, "tokens * heads_kv exceeds the int32 range");
  if ((st = fcl_check_seqlens(ctx, seqlens, "seqlens", batch))) return st;
  if ((st = fcl_check_output_distinct(ctx, k_cache, "k_cache")) ||
      (st = fcl_check_output_distinct(ctx, v_cache, "v_cache")))
    return st;
  if (fcl_views_conflict(k_cache, k_new, 0) || fcl_views_conflict(k_cache, v_new, 0) ||
      fcl_views_conflict(v_cache, k_new, 0) || fcl_views_conflict(v_cache, v_new, 0) ||
      fcl_views_conflict(k_cache, v_cache, 0))
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "the caches overlap each other or k_new/v_new");
  {
    /* The append writes the caches while it reads seqlens and the block table. */
    const size_t b4 = (size_t)batch * sizeof(cl_int);
    const fcl_aux aux[2] = {{seqlens, 0, b4, "seqlens"},
                            {kv->paged ? desc->cache.block_table : NULL, 0, b4 * (size_t)kv->max_pages, "desc.cache.block_table"}};
    const flashcl_tensor *outs[2] = {k_cache, v_cache};
    static const char *const names[2] = {"k_cache", "v_cache"};
    if ((st = fcl_check_aux_buffers(ctx, aux, 2, outs, names, 2))) return st;
    const flashcl_tensor *all[4] = {k_new, v_new, k_cache, v_cache};
    if ((st = fcl_append_check_scales(ctx, desc, kv, all, aux, kv->paged ? 2 : 1))) return st;
  }
  return FLASHCL_SUCCESS;
}

/* kv_append (plain caches) or kv_append_quant (a quantized side), set up and enqueued. */
static flashcl_status fcl_append_enqueue(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                         const flashcl_tensor *k_new, const flashcl_tensor *v_new,
                                         const flashcl_tensor *k_cache, const flashcl_tensor *v_cache, cl_mem seqlens,
                                         const fcl_kv_info *kv, cl_uint num_events_in_wait_list,
                                         const cl_event *event_wait_list, cl_event *out_event) {
  flashcl_status st;
  const int quant = kv->k_quant || kv->v_quant;
  char opts[192], qopts[96];
  fcl_kv_quant_options(kv, k_cache, v_cache, k_new->dtype, qopts, sizeof qopts);
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=%d -DHEAD_DIM=%d -DHEAD_DIM_V=%d -DPAGED=%d%s", (int)k_new->dtype,
           kv->head_dim, kv->head_dim_v, kv->paged, qopts);
  cl_kernel kern;
  if ((st = fcl_get_kernel(ctx, "dtype.cl+kv_quant.cl+kv_append.cl", opts, quant ? "kv_append_quant" : "kv_append",
                           &kern)))
    return st;
  fcl_args a = {kern, 0, CL_SUCCESS};
  fcl_arg_tensor(&a, k_new);
  fcl_arg_tensor(&a, v_new);
  fcl_arg_tensor(&a, k_cache);
  fcl_arg_tensor(&a, v_cache);
  fcl_arg_mem(&a, seqlens);
  fcl_arg_mem(&a, kv->paged ? desc->cache.block_table : NULL);
  fcl_arg_int(&a, kv->max_pages);
  fcl_arg_int(&a, kv->page_size);
  fcl_arg_int(&a, kv->num_pages);
  fcl_arg_int(&a, kv->capacity);
  fcl_arg_int(&a, kv->heads_kv);
  if (quant) {
    fcl_arg_mem(&a, kv->k_quant ? desc->cache.k_scale : NULL);
    fcl_arg_mem(&a, kv->v_quant ? desc->cache.v_scale : NULL);
  }
  if (a.err != CL_SUCCESS) return fcl_cl_fail(ctx, a.err, "clSetKernelArg(kv_append)");
  /* kv_append: a work-item per 4 elements; kv_append_quant: per K or V row. */
  size_t global[3] = {quant ? 2 : (size_t)kv->head_dim / 4, (size_t)k_new->shape[1] * (size_t)kv->heads_kv,
                      (size_t)k_new->shape[0]};
  cl_int err = clEnqueueNDRangeKernel(ctx->queue, kern, 3, NULL, global, NULL, num_events_in_wait_list,
                                      num_events_in_wait_list ? event_wait_list : NULL, out_event);
  if (err != CL_SUCCESS) return fcl_cl_fail(ctx, err, "clEnqueueNDRangeKernel(kv_append)");
  return FLASHCL_SUCCESS;
}

static flashcl_status fcl_kv_cache_append_locked(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                                 const flashcl_tensor *k_new, const flashcl_tensor *v_new,
                                                 const flashcl_tensor *k_cache, const flashcl_tensor *v_cache,
                                                 cl_mem seqlens, cl_uint num_events_in_wait_list,
                                                 const cl_event *event_wait_list, cl_event *out_event) {
  if (!ctx) return FLASHCL_ERROR_INVALID_ARGUMENT;
  fcl_clear_error(ctx);
  flashcl_kv_append_desc desc_full;
  flashcl_status imp = fcl_kv_append_desc_import(ctx, &desc, &desc_full);
  if (imp != FLASHCL_SUCCESS) return imp;
  if (num_events_in_wait_list && !event_wait_list)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_events_in_wait_list is %u but event_wait_list is NULL",
                    num_events_in_wait_list);
  fcl_kv_info kv;
  flashcl_status st = fcl_append_validate(ctx, desc, k_new, v_new, k_cache, v_cache, seqlens, &kv);
  if (st != FLASHCL_SUCCESS) return st;
  return fcl_append_enqueue(ctx, desc, k_new, v_new, k_cache, v_cache, seqlens, &kv, num_events_in_wait_list,
                            event_wait_list, out_event);
}

flashcl_status flashcl_kv_cache_append(flashcl_context *ctx, const flashcl_kv_append_desc *desc,
                                       const flashcl_tensor *k_new, const flashcl_tensor *v_new,
                                       const flashcl_tensor *k_cache, const flashcl_tensor *v_cache, cl_mem seqlens,
                                       cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                       cl_event *out_event) {
  fcl_enter(ctx);
  return fcl_leave(ctx, fcl_kv_cache_append_locked(ctx, desc, k_new, v_new, k_cache, v_cache, seqlens,
                                                   num_events_in_wait_list, event_wait_list, out_event));
}
