/* A second chance for the later commands of a call.
 *
 * A call that writes its outputs with several commands (the backward's dK/dV
 * and then dQ, the naive backward's three unpacks) cannot take an earlier
 * command back once it is enqueued. When a later one cannot be set up or
 * enqueued for want of resources, the call flushes the queue, so that the
 * earlier commands go to the device and what they hold can be released, and
 * tries that command once more: a transient shortage then still gives the
 * right result, not a failed call with some outputs written. It flushes and
 * never waits: the caller's queue may hold commands that wait on a user event
 * the caller sets only after this call returns. A second failure fails the call, and the outputs the
 * earlier commands write stay written (docs/reliability.md, "Fault
 * injection"). Holding every writer behind a user event would close that gap
 * too, but cost the H100's backward 2-3% on every call (BENCHMARKS.md,
 * twentieth session).
 */
#include "core/internal.h"

int fcl_retry_after_flush(flashcl_context *ctx, cl_command_queue side, cl_int err, const char *what) {
  if (!fcl_cl_is_shortage(err)) return 0;
  fcl_log(ctx, "%s failed (%d) after earlier commands of the call: flushing the queue and trying once more", what,
          (int)err);
  clFlush(ctx->queue);
  if (side && side != ctx->queue) clFlush(side);
  return 1;
}
