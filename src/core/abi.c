/* Descriptor sizes: how a public struct can grow without breaking programs
 * built against an older header. Each descriptor starts with struct_size,
 * the sizeof its caller was compiled with (set by the *_init() wrappers in
 * flashcl.h). Fields are only ever added at the end, so an older caller's
 * struct is a prefix of this library's: its bytes are copied and the fields
 * it lacks keep their defaults. */
#include "core/internal.h"

flashcl_status fcl_struct_init(void *user, size_t size, const void *defaults, size_t full_size) {
  if (!user || size < sizeof(size_t)) return FLASHCL_ERROR_INVALID_ARGUMENT;
  /* A caller built with a newer header gets the fields this library knows;
   * its calls are then refused by fcl_struct_import, with a message. */
  const size_t known = size < full_size ? size : full_size;
  memset(user, 0, size);
  memcpy(user, defaults, known);
  memcpy(user, &size, sizeof size);
  return FLASHCL_SUCCESS;
}

flashcl_status fcl_struct_import(flashcl_context *ctx, const void *user, size_t first_size, void *full,
                                 size_t full_size, const char *type) {
  size_t n;
  memcpy(&n, user, sizeof n);
  if (n == 0) n = first_size; /* zeroed by hand: the first sized layout */
  if (n > full_size)
    return fcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                    "%s.struct_size is %zu but this library's %s has %zu bytes: the program was built against a "
                    "newer flashcl.h than the library it runs with (%s)",
                    type, n, type, full_size, flashcl_version_string());
  if (n < first_size)
    return fcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                    "%s.struct_size is %zu, less than the smallest layout (%zu bytes): fill the struct with its "
                    "*_init() function",
                    type, n, first_size);
  memcpy(full, user, n);
  memcpy(full, &full_size, sizeof full_size);
  return FLASHCL_SUCCESS;
}

void fcl_score_desc_defaults(flashcl_score_desc *score) {
  memset(score, 0, sizeof *score);
  score->window_left = -1;
  score->window_right = -1;
}

void fcl_kv_layout_defaults(flashcl_kv_layout *cache) {
  memset(cache, 0, sizeof *cache);
  /* The kind the append fills by itself, so a quantized cache needs no
   * calibration to start with. */
  cache->k_scale_kind = FLASHCL_KV_SCALE_TOKEN;
  cache->v_scale_kind = FLASHCL_KV_SCALE_TOKEN;
}
