/* Decode, KV cache and merge: the cache validation shared by
 * flashcl_attention_decode and flashcl_kv_cache_append. */
#ifndef FLASHCL_DECODE_H
#define FLASHCL_DECODE_H

#include "core/internal.h"

/* ---- decode, KV cache and merge (src/decode/decode.c, src/decode/kv_cache.c, src/decode/merge.c) ---- */

/* A validated KV cache (see flashcl_decode_desc). Contiguous: num_pages = batch,
 * page b holds sequence b. */
typedef struct fcl_kv_layout {
  int paged;
  int heads_kv, head_dim;
  int page_size, max_pages, num_pages;
  int capacity; /* tokens per sequence */
} fcl_kv_layout;

flashcl_status fcl_check_kv_cache(flashcl_context *ctx, const flashcl_decode_desc *desc, const flashcl_tensor *kc,
                                  const flashcl_tensor *vc, int batch, fcl_kv_layout *out);
/* An int32 buffer of at least batch entries. */
flashcl_status fcl_check_seqlens(flashcl_context *ctx, cl_mem seqlens, const char *name, int batch);

/* A caller's descriptor as this library's struct (see
 * fcl_attention_desc_import): every public function taking a
 * flashcl_decode_desc calls it first. */
flashcl_status fcl_decode_desc_import(flashcl_context *ctx, const flashcl_decode_desc **desc,
                                      flashcl_decode_desc *full);

#endif
