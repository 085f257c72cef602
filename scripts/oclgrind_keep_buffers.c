/*
 * oclgrind_keep_buffers.c: an LD_PRELOAD shim for scripts/oclgrind.sh that
 * makes clReleaseMemObject keep every buffer alive. Oclgrind 21.10 gives a new
 * buffer the index of a released one, but its --uninitialized plugin keeps the
 * old buffer's shadow memory (it has no hook for released buffers): writes past
 * the old size are dropped and later reads of them reported as uninitialized.
 * With no buffer ever released, no index is reused. Only for Oclgrind runs of
 * short tests: the memory is never given back.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

cl_int clReleaseMemObject(cl_mem memobj) {
  (void)memobj;
  return CL_SUCCESS;
}
