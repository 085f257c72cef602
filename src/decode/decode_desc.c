/* The decode and append descriptors' defaults and the import of a caller's
 * struct (src/core/abi.c says why descriptors carry their size). */
#include "core/internal.h"
#include "decode/decode.h"

#include <string.h>

/* The smallest flashcl_decode_desc taken: 0.2's, the first layout with
 * struct_size. Fields added later go at the end, and this stays. (0.2 is
 * unreleased: its layout is the one split by concern.) */
#define FCL_DECODE_DESC_FIRST sizeof(flashcl_decode_desc)

static void fcl_decode_desc_defaults(flashcl_decode_desc *desc) {
  memset(desc, 0, sizeof *desc);
  desc->struct_size = sizeof *desc;
  fcl_score_desc_defaults(&desc->score);
  fcl_kv_layout_defaults(&desc->cache);
}

flashcl_status flashcl_decode_desc_init_size(flashcl_decode_desc *desc, size_t size) {
  flashcl_decode_desc d;
  fcl_decode_desc_defaults(&d);
  return fcl_struct_init(desc, size, &d, sizeof d);
}

flashcl_status fcl_decode_desc_import(flashcl_context *ctx, const flashcl_decode_desc **desc,
                                      flashcl_decode_desc *full) {
  if (!*desc) return FLASHCL_SUCCESS;
  fcl_decode_desc_defaults(full);
  flashcl_status st = fcl_struct_import(ctx, *desc, FCL_DECODE_DESC_FIRST, full, sizeof *full, "flashcl_decode_desc");
  if (st == FLASHCL_SUCCESS) *desc = full;
  return st;
}

/* flashcl_kv_append_desc: the same rules, first layout 0.2's. */
#define FCL_KV_APPEND_DESC_FIRST sizeof(flashcl_kv_append_desc)

static void fcl_kv_append_desc_defaults(flashcl_kv_append_desc *desc) {
  memset(desc, 0, sizeof *desc);
  desc->struct_size = sizeof *desc;
  fcl_kv_layout_defaults(&desc->cache);
}

flashcl_status flashcl_kv_append_desc_init_size(flashcl_kv_append_desc *desc, size_t size) {
  flashcl_kv_append_desc d;
  fcl_kv_append_desc_defaults(&d);
  return fcl_struct_init(desc, size, &d, sizeof d);
}

flashcl_status fcl_kv_append_desc_import(flashcl_context *ctx, const flashcl_kv_append_desc **desc,
                                         flashcl_kv_append_desc *full) {
  if (!*desc) return FLASHCL_SUCCESS;
  fcl_kv_append_desc_defaults(full);
  flashcl_status st =
      fcl_struct_import(ctx, *desc, FCL_KV_APPEND_DESC_FIRST, full, sizeof *full, "flashcl_kv_append_desc");
  if (st == FLASHCL_SUCCESS) *desc = full;
  return st;
}
