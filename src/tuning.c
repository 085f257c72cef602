/* The tuning sources of a context (README "Tuning"). */
#include "internal.h"

#include <stdlib.h>

void fcl_tuning_free(flashcl_context *ctx) {
  free(ctx->tuning_log);
  ctx->tuning_log = NULL;
}
