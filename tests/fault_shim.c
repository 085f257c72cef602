/* The wrappers of tests/fault_shim.h. Linked only into test_faults, with
 * -Wl,--wrap=<fn> for every OpenCL function below (tests/CMakeLists.txt); the
 * allocation wrappers are reached through tests/fault_alloc.h's macros. */
#include "fault_shim.h"

#include <stdio.h>
#include <stdlib.h>

static int armed;
static int fired;
static int armed_fn = -1;
static long armed_nth;
static long counts[FAULT_FN_COUNT];
static long live_allocs;

static const char *const fn_names[FAULT_FN_COUNT] = {
    "clCreateBuffer", "clCreateProgramWithSource", "clCreateProgramWithBinary", "clBuildProgram",
    "clCreateKernel", "clSetKernelArg", "clEnqueueNDRangeKernel", "clCreateContext",
    "clCreateCommandQueue", "malloc", "calloc", "realloc"};
static const char *const kind_names[FK_COUNT] = {"cl_mem", "cl_program", "cl_kernel", "cl_event", "cl_command_queue",
                                                 "cl_context"};

const char *fault_fn_name(int fn) { return fn >= 0 && fn < FAULT_FN_COUNT ? fn_names[fn] : "?"; }
const char *fault_kind_name(int kind) { return kind >= 0 && kind < FK_COUNT ? kind_names[kind] : "?"; }

void fault_arm(int fn, long nth) {
  for (int i = 0; i < FAULT_FN_COUNT; i++) counts[i] = 0;
  armed_fn = fn;
  armed_nth = nth;
  fired = 0;
  armed = 1;
}

void fault_disarm(void) { armed = 0; }
long fault_count(int fn) { return fn >= 0 && fn < FAULT_FN_COUNT ? counts[fn] : 0; }
int fault_fired(void) { return fired; }
long fault_live_allocs(void) { return live_allocs; }

/* Counts a call of fn; 1 if this one must fail. */
static int fault_hit(int fn) {
  if (!armed) return 0;
  counts[fn]++;
  if (fn == armed_fn && counts[fn] == armed_nth) {
    fired = 1;
    return 1;
  }
  return 0;
}

/* ---- tracked objects: handle, kind, reference count ---- */
enum { TRACK_CAP = 1 << 14 };
static struct {
  const void *h;
  int kind;
  long refs;
} tracked[TRACK_CAP];
static int ntracked;

static void track_new(const void *h, int kind) {
  if (!h || !armed) return;
  for (int i = 0; i < ntracked; i++)
    if (tracked[i].h == h && tracked[i].refs > 0) {
      /* Should not happen: a live handle returned again. */
      tracked[i].refs++;
      return;
    }
  for (int i = 0; i < ntracked; i++)
    if (tracked[i].refs <= 0) {
      tracked[i].h = h;
      tracked[i].kind = kind;
      tracked[i].refs = 1;
      return;
    }
  if (ntracked == TRACK_CAP) {
    fprintf(stderr, "fault_shim: more than %d tracked objects\n", TRACK_CAP);
    abort();
  }
  tracked[ntracked].h = h;
  tracked[ntracked].kind = kind;
  tracked[ntracked].refs = 1;
  ntracked++;
}

static void track_ref(const void *h, int delta) {
  if (!h) return;
  for (int i = 0; i < ntracked; i++)
    if (tracked[i].h == h && tracked[i].refs > 0) {
      tracked[i].refs += delta;
      return;
    }
}

long fault_live(int kind) {
  long n = 0;
  for (int i = 0; i < ntracked; i++)
    if (tracked[i].refs > 0 && tracked[i].kind == kind) n++;
  return n;
}

/* ---- allocations (the library's only, through tests/fault_alloc.h) ---- */
void *fault_malloc(size_t n) {
  if (fault_hit(FAULT_MALLOC)) return NULL;
  void *p = malloc(n);
  if (p) live_allocs++;
  return p;
}

void *fault_calloc(size_t n, size_t size) {
  if (fault_hit(FAULT_CALLOC)) return NULL;
  void *p = calloc(n, size);
  if (p) live_allocs++;
  return p;
}

void *fault_realloc(void *old, size_t n) {
  if (fault_hit(FAULT_REALLOC)) return NULL;
  void *p = realloc(old, n);
  if (p && !old) live_allocs++;
  return p;
}

void fault_free(void *p) {
  if (p) live_allocs--;
  free(p);
}

/* ---- OpenCL ---- */
#define FAIL_WITH(code) \
  do {                  \
    if (errcode_ret) *errcode_ret = (code); \
    return NULL;        \
  } while (0)

cl_mem __real_clCreateBuffer(cl_context, cl_mem_flags, size_t, void *, cl_int *);
cl_mem __wrap_clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                             cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_BUFFER)) FAIL_WITH(CL_MEM_OBJECT_ALLOCATION_FAILURE);
  cl_mem m = __real_clCreateBuffer(context, flags, size, host_ptr, errcode_ret);
  track_new(m, FK_MEM);
  return m;
}

cl_program __real_clCreateProgramWithSource(cl_context, cl_uint, const char **, const size_t *, cl_int *);
cl_program __wrap_clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                            const size_t *lengths, cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_PROGRAM_SOURCE)) FAIL_WITH(CL_OUT_OF_HOST_MEMORY);
  cl_program p = __real_clCreateProgramWithSource(context, count, strings, lengths, errcode_ret);
  track_new(p, FK_PROGRAM);
  return p;
}

cl_program __real_clCreateProgramWithBinary(cl_context, cl_uint, const cl_device_id *, const size_t *,
                                            const unsigned char **, cl_int *, cl_int *);
cl_program __wrap_clCreateProgramWithBinary(cl_context context, cl_uint num_devices, const cl_device_id *devices,
                                            const size_t *lengths, const unsigned char **binaries,
                                            cl_int *binary_status, cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_PROGRAM_BINARY)) FAIL_WITH(CL_OUT_OF_HOST_MEMORY);
  cl_program p = __real_clCreateProgramWithBinary(context, num_devices, devices, lengths, binaries, binary_status,
                                                  errcode_ret);
  track_new(p, FK_PROGRAM);
  return p;
}

typedef void(CL_CALLBACK *fault_build_notify)(cl_program, void *);
cl_int __real_clBuildProgram(cl_program, cl_uint, const cl_device_id *, const char *, fault_build_notify, void *);
cl_int __wrap_clBuildProgram(cl_program program, cl_uint num_devices, const cl_device_id *devices, const char *options,
                             fault_build_notify notify, void *user_data) {
  if (fault_hit(FAULT_BUILD_PROGRAM)) return CL_BUILD_PROGRAM_FAILURE;
  return __real_clBuildProgram(program, num_devices, devices, options, notify, user_data);
}

cl_kernel __real_clCreateKernel(cl_program, const char *, cl_int *);
cl_kernel __wrap_clCreateKernel(cl_program program, const char *name, cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_KERNEL)) FAIL_WITH(CL_OUT_OF_RESOURCES);
  cl_kernel k = __real_clCreateKernel(program, name, errcode_ret);
  track_new(k, FK_KERNEL);
  return k;
}

cl_int __real_clSetKernelArg(cl_kernel, cl_uint, size_t, const void *);
cl_int __wrap_clSetKernelArg(cl_kernel kernel, cl_uint index, size_t size, const void *value) {
  if (fault_hit(FAULT_SET_KERNEL_ARG)) return CL_OUT_OF_RESOURCES;
  return __real_clSetKernelArg(kernel, index, size, value);
}

cl_int __real_clEnqueueNDRangeKernel(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                                     const size_t *, cl_uint, const cl_event *, cl_event *);
cl_int __wrap_clEnqueueNDRangeKernel(cl_command_queue queue, cl_kernel kernel, cl_uint dim, const size_t *offset,
                                     const size_t *global, const size_t *local, cl_uint nwait, const cl_event *wait,
                                     cl_event *event) {
  if (fault_hit(FAULT_ENQUEUE_KERNEL)) return CL_OUT_OF_RESOURCES;
  cl_int err = __real_clEnqueueNDRangeKernel(queue, kernel, dim, offset, global, local, nwait, wait, event);
  if (err == CL_SUCCESS && event) track_new(*event, FK_EVENT);
  return err;
}

typedef void(CL_CALLBACK *fault_ctx_notify)(const char *, const void *, size_t, void *);
cl_context __real_clCreateContext(const cl_context_properties *, cl_uint, const cl_device_id *, fault_ctx_notify,
                                  void *, cl_int *);
cl_context __wrap_clCreateContext(const cl_context_properties *props, cl_uint num_devices, const cl_device_id *devices,
                                  fault_ctx_notify notify, void *user_data, cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_CONTEXT)) FAIL_WITH(CL_OUT_OF_HOST_MEMORY);
  cl_context c = __real_clCreateContext(props, num_devices, devices, notify, user_data, errcode_ret);
  track_new(c, FK_CONTEXT);
  return c;
}

cl_command_queue __real_clCreateCommandQueue(cl_context, cl_device_id, cl_command_queue_properties, cl_int *);
cl_command_queue __wrap_clCreateCommandQueue(cl_context context, cl_device_id device,
                                             cl_command_queue_properties props, cl_int *errcode_ret) {
  if (fault_hit(FAULT_CREATE_QUEUE)) FAIL_WITH(CL_OUT_OF_HOST_MEMORY);
  cl_command_queue q = __real_clCreateCommandQueue(context, device, props, errcode_ret);
  track_new(q, FK_QUEUE);
  return q;
}

/* Other commands that can return an event: tracked, never failed. */
cl_int __real_clEnqueueBarrierWithWaitList(cl_command_queue, cl_uint, const cl_event *, cl_event *);
cl_int __wrap_clEnqueueBarrierWithWaitList(cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                           cl_event *event) {
  cl_int err = __real_clEnqueueBarrierWithWaitList(queue, nwait, wait, event);
  if (err == CL_SUCCESS && event) track_new(*event, FK_EVENT);
  return err;
}

cl_int __real_clEnqueueCopyBuffer(cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *,
                                  cl_event *);
cl_int __wrap_clEnqueueCopyBuffer(cl_command_queue queue, cl_mem src, cl_mem dst, size_t src_off, size_t dst_off,
                                  size_t size, cl_uint nwait, const cl_event *wait, cl_event *event) {
  cl_int err = __real_clEnqueueCopyBuffer(queue, src, dst, src_off, dst_off, size, nwait, wait, event);
  if (err == CL_SUCCESS && event) track_new(*event, FK_EVENT);
  return err;
}

cl_int __real_clEnqueueReadBuffer(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,
                                  const cl_event *, cl_event *);
cl_int __wrap_clEnqueueReadBuffer(cl_command_queue queue, cl_mem buf, cl_bool blocking, size_t off, size_t size,
                                  void *ptr, cl_uint nwait, const cl_event *wait, cl_event *event) {
  cl_int err = __real_clEnqueueReadBuffer(queue, buf, blocking, off, size, ptr, nwait, wait, event);
  if (err == CL_SUCCESS && event) track_new(*event, FK_EVENT);
  return err;
}

#define RETAIN_RELEASE(Type, Name)                                    \
  cl_int __real_clRetain##Name(Type);                                 \
  cl_int __real_clRelease##Name(Type);                                \
  cl_int __wrap_clRetain##Name(Type h) {                              \
    cl_int err = __real_clRetain##Name(h);                            \
    if (err == CL_SUCCESS) track_ref(h, +1);                          \
    return err;                                                       \
  }                                                                   \
  cl_int __wrap_clRelease##Name(Type h) {                             \
    cl_int err = __real_clRelease##Name(h);                           \
    if (err == CL_SUCCESS) track_ref(h, -1);                          \
    return err;                                                       \
  }
RETAIN_RELEASE(cl_mem, MemObject)
RETAIN_RELEASE(cl_program, Program)
RETAIN_RELEASE(cl_kernel, Kernel)
RETAIN_RELEASE(cl_event, Event)
RETAIN_RELEASE(cl_command_queue, CommandQueue)
RETAIN_RELEASE(cl_context, Context)
