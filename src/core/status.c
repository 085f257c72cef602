/* Status strings and the context's last-error message. */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

const char *flashcl_status_string(int status) {
  switch (status) {
#define FLASHCL_X_CASE(name, value, text) \
  case value:                             \
    return #name ": " text;
    FLASHCL_STATUS_LIST(FLASHCL_X_CASE)
#undef FLASHCL_X_CASE
  default:
    break;
  }
  if (status < 0 && status > -1000) return fcl_cl_error_name(status);
  if (status == -1001) return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL platform is installed)";
  if (status <= -1024 && status > -3000) return "CLBlast error";
  return "unknown status";
}

const char *fcl_cl_error_name(cl_int err) {
  switch (err) {
#define C(x) case x: return #x;
    C(CL_SUCCESS) C(CL_DEVICE_NOT_FOUND) C(CL_DEVICE_NOT_AVAILABLE) C(CL_COMPILER_NOT_AVAILABLE)
    C(CL_MEM_OBJECT_ALLOCATION_FAILURE) C(CL_OUT_OF_RESOURCES) C(CL_OUT_OF_HOST_MEMORY)
    C(CL_PROFILING_INFO_NOT_AVAILABLE) C(CL_MEM_COPY_OVERLAP) C(CL_IMAGE_FORMAT_MISMATCH)
    C(CL_IMAGE_FORMAT_NOT_SUPPORTED) C(CL_BUILD_PROGRAM_FAILURE) C(CL_MAP_FAILURE)
    C(CL_MISALIGNED_SUB_BUFFER_OFFSET) C(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    C(CL_COMPILE_PROGRAM_FAILURE) C(CL_LINKER_NOT_AVAILABLE) C(CL_LINK_PROGRAM_FAILURE)
    C(CL_DEVICE_PARTITION_FAILED) C(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) C(CL_INVALID_VALUE)
    C(CL_INVALID_DEVICE_TYPE) C(CL_INVALID_PLATFORM) C(CL_INVALID_DEVICE) C(CL_INVALID_CONTEXT)
    C(CL_INVALID_QUEUE_PROPERTIES) C(CL_INVALID_COMMAND_QUEUE) C(CL_INVALID_HOST_PTR)
    C(CL_INVALID_MEM_OBJECT) C(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) C(CL_INVALID_IMAGE_SIZE)
    C(CL_INVALID_SAMPLER) C(CL_INVALID_BINARY) C(CL_INVALID_BUILD_OPTIONS) C(CL_INVALID_PROGRAM)
    C(CL_INVALID_PROGRAM_EXECUTABLE) C(CL_INVALID_KERNEL_NAME) C(CL_INVALID_KERNEL_DEFINITION)
    C(CL_INVALID_KERNEL) C(CL_INVALID_ARG_INDEX) C(CL_INVALID_ARG_VALUE) C(CL_INVALID_ARG_SIZE)
    C(CL_INVALID_KERNEL_ARGS) C(CL_INVALID_WORK_DIMENSION) C(CL_INVALID_WORK_GROUP_SIZE)
    C(CL_INVALID_WORK_ITEM_SIZE) C(CL_INVALID_GLOBAL_OFFSET) C(CL_INVALID_EVENT_WAIT_LIST)
    C(CL_INVALID_EVENT) C(CL_INVALID_OPERATION) C(CL_INVALID_GL_OBJECT) C(CL_INVALID_BUFFER_SIZE)
    C(CL_INVALID_MIP_LEVEL) C(CL_INVALID_GLOBAL_WORK_SIZE) C(CL_INVALID_PROPERTY)
    C(CL_INVALID_IMAGE_DESCRIPTOR) C(CL_INVALID_COMPILER_OPTIONS) C(CL_INVALID_LINKER_OPTIONS)
    C(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef C
  default:
    return "unknown OpenCL error";
  }
}

/* Where a message goes when there is no context to keep it: a failed
 * flashcl_context_create has none to return. Per thread, so that threads
 * creating contexts at once read their own. */
#if defined(_MSC_VER)
#define FCL_THREAD_LOCAL __declspec(thread)
#elif defined(__GNUC__) || defined(__clang__)
#define FCL_THREAD_LOCAL __thread
#else
#define FCL_THREAD_LOCAL
#endif
static FCL_THREAD_LOCAL char fcl_thread_errmsg[4096];
/* The calling thread's copy of the message of its last call on a context, and
 * that context's serial (0: none), so that a thread reads its own call's
 * message while other threads make calls on the same context. */
static FCL_THREAD_LOCAL char fcl_thread_callmsg[FLASHCL_ERRMSG_CAP];
static FCL_THREAD_LOCAL int64_t fcl_thread_callctx;

/* Copies a message into a buffer of cap bytes, cut to fit (only its length is
 * copied: a call that succeeded copies one byte). */
static void fcl_copy_message(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Copies ctx's message (the caller holds ctx's lock) for the calling thread. */
static void fcl_publish_error(const flashcl_context *ctx) {
  fcl_copy_message(fcl_thread_callmsg, sizeof fcl_thread_callmsg, ctx->errmsg);
  fcl_thread_callctx = ctx->serial;
}

flashcl_status fcl_query_settled(flashcl_context *ctx, int defers0, flashcl_status st) {
  if (st != FLASHCL_SUCCESS || !ctx || ctx->probe_defers == defers0) return st;
  return fcl_fail(ctx, FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY,
                  "the tensor-core probe could not run (device out of memory), so this answer would not hold for "
                  "the next call; ask again once memory is free (%s)", ctx->mma_reason);
}

void fcl_enter(const flashcl_context *ctx) {
  if (ctx) fcl_mutex_lock(&((flashcl_context *)ctx)->lock);
}

flashcl_status fcl_leave(const flashcl_context *ctx, flashcl_status st) {
  if (ctx) {
    fcl_publish_error(ctx);
    fcl_mutex_unlock(&((flashcl_context *)ctx)->lock);
  }
  return st;
}

static void fcl_vset(flashcl_context *ctx, const char *fmt, va_list ap) {
  if (!ctx) {
    vsnprintf(fcl_thread_errmsg, sizeof fcl_thread_errmsg, fmt, ap);
    return;
  }
  vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
  if (ctx->verbose) fprintf(stderr, "flashcl: %s\n", ctx->errmsg);
}

void fcl_keep_create_error(const flashcl_context *ctx) {
  if (ctx) fcl_copy_message(fcl_thread_errmsg, sizeof fcl_thread_errmsg, ctx->errmsg);
}

flashcl_status fcl_fail(flashcl_context *ctx, flashcl_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fcl_vset(ctx, fmt, ap);
  va_end(ap);
  return status;
}

flashcl_status fcl_cl_fail(flashcl_context *ctx, cl_int err, const char *what) {
  flashcl_status st = FLASHCL_ERROR_OPENCL;
  if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES || err == CL_INVALID_BUFFER_SIZE)
    st = FLASHCL_ERROR_DEVICE_OUT_OF_MEMORY;
  else if (err == CL_OUT_OF_HOST_MEMORY)
    st = FLASHCL_ERROR_HOST_OUT_OF_MEMORY;
  return fcl_fail(ctx, st, "%s failed: %s (%d)", what, fcl_cl_error_name(err), (int)err);
}

void fcl_clear_error(flashcl_context *ctx) {
  if (ctx)
    ctx->errmsg[0] = '\0';
  else
    fcl_thread_errmsg[0] = '\0';
}

void fcl_log(const flashcl_context *ctx, const char *fmt, ...) {
  if (!ctx || !ctx->verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("flashcl: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* The thread's copy of its last call's message on ctx; a thread that made no
 * call on ctx since its last call on another context gets a copy of ctx's
 * current message, taken under the lock. */
const char *flashcl_context_last_error(const flashcl_context *ctx) {
  if (!ctx) return fcl_thread_errmsg;
  if (fcl_thread_callctx != ctx->serial) {
    fcl_enter(ctx);
    fcl_leave(ctx, FLASHCL_SUCCESS);
  }
  return fcl_thread_callmsg;
}

int fcl_mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > (size_t)-1 / a) return 0;
  *out = a * b;
  return 1;
}

int fcl_add_size(size_t a, size_t b, size_t *out) {
  if (b > (size_t)-1 - a) return 0;
  *out = a + b;
  return 1;
}
