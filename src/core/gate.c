/* A call's all-or-nothing gate.
 *
 * A call that writes its outputs with several commands (the backward's dK/dV
 * and dQ kernels, the naive backward's three unpacks) may fail to enqueue a
 * later one after earlier ones were enqueued; those must then not run, or a
 * failed call would leave some outputs written. Each output-writing command
 * therefore waits on a user event that opens only once every command of the
 * call is enqueued. On failure the event is set to an error status instead:
 * OpenCL terminates the commands that wait on it, and they write nothing.
 */
#include "core/internal.h"

flashcl_status fcl_gate_open(flashcl_context *ctx, cl_event *gate) {
  cl_int err = CL_SUCCESS;
  *gate = clCreateUserEvent(ctx->context, &err);
  if (err != CL_SUCCESS || !*gate) {
    *gate = NULL;
    return fcl_cl_fail(ctx, err != CL_SUCCESS ? err : CL_OUT_OF_HOST_MEMORY, "clCreateUserEvent (the call's gate)");
  }
  return FLASHCL_SUCCESS;
}

cl_uint fcl_gate_wait(cl_event gate, cl_event after, cl_event list[2]) {
  cl_uint n = 0;
  if (after) list[n++] = after;
  if (gate) list[n++] = gate;
  return n;
}

void fcl_gate_close(flashcl_context *ctx, cl_event gate, flashcl_status st) {
  if (!gate) return;
  /* An error status is how OpenCL cancels the commands that wait on the gate. */
  clSetUserEventStatus(gate, st == FLASHCL_SUCCESS ? CL_COMPLETE : -1);
  clReleaseEvent(gate);
  /* Some drivers (NVIDIA's) report a cancelled command through the queue's
   * next clFinish: take that report here, so that the caller's queue is as
   * the failed call found it. A failure path may block. */
  if (st != FLASHCL_SUCCESS) clFinish(ctx->queue);
}
