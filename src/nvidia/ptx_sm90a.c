/* PTX retargeting: NVIDIA's OpenCL compiler emits `.target sm_90`, where the
 * wgmma instructions do not exist. cl/nvidia/flash_fwd_wgmma.cl writes them as PTX
 * comments behind a marker; deleting the markers and naming the sm_90a target
 * turns the compiler's own output into the module that the driver assembles
 * (src/core/program.c, fcl_get_kernel_sm90a). */
#include "ptx_sm90a.h"

#include <stdlib.h>
#include <string.h>

char *fcl_ptx_to_sm90a(const char *ptx, const char **why) {
  static const char target[] = ".target sm_90";
  const size_t tlen = sizeof target - 1, mlen = strlen(FCL_SM90A_MARKER);
  const char *tgt = strstr(ptx, target);
  /* The directive goes on with a comma (", texmode_independent"), a blank or the line's end. */
  if (!tgt || (tgt[tlen] != ',' && tgt[tlen] != '\n' && tgt[tlen] != ' ' && tgt[tlen] != '\r' && tgt[tlen] != '\t')) {
    *why = "the compiler's PTX does not target sm_90";
    return NULL;
  }
  if (!strstr(ptx, FCL_SM90A_MARKER)) {
    *why = "the compiler's PTX has none of the sm_90a instructions";
    return NULL;
  }
  char *out = malloc(strlen(ptx) + 2), *w = out;
  if (!out) {
    *why = "out of host memory";
    return NULL;
  }
  for (const char *r = ptx; *r;) {
    if (r == tgt) {
      memcpy(w, target, tlen);
      w += tlen;
      *w++ = 'a';
      r += tlen;
    } else if (*r == FCL_SM90A_MARKER[0] && strncmp(r, FCL_SM90A_MARKER, mlen) == 0) {
      r += mlen;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
  return out;
}
