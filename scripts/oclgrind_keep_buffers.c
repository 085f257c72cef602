/*
 * oclgrind_keep_buffers.c: an LD_PRELOAD shim for scripts/oclgrind.sh that
 * makes clReleaseMemObject keep every buffer alive (finding 3 of
 * docs/reliability.md). Oclgrind 21.10 gives a new buffer the index of a
 * released one, but its --uninitialized plugin has no hook for released
 * buffers and keeps the old buffer's shadow memory: a kernel's writes past the
 * old size are dropped and later reads of them reported as uninitialized
 * (and reads of unwritten bytes below it pass as initialized). With no buffer
 * ever released, no index is reused. It must come before Oclgrind's own
 * runtime in LD_PRELOAD (that library defines clReleaseMemObject too, and
 * `oclgrind` puts itself first), so the script preloads it from inside the
 * program Oclgrind launches. Only for Oclgrind runs of short tests: the memory
 * is never given back.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

cl_int clReleaseMemObject(cl_mem memobj) {
  (void)memobj;
  return CL_SUCCESS;
}
