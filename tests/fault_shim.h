/* Fault injection for tests/test_faults.c (docs/reliability.md, "Fault injection").
 *
 * tests/fault_shim.c wraps OpenCL entry points at link time (-Wl,--wrap=<fn>)
 * and the library's allocations (tests/fault_alloc.h). While armed, every call
 * of a wrapped function is counted per function, and the Nth call of the armed
 * function fails (OpenCL: a negative code, no object and no event made;
 * allocations: NULL). Objects (cl_mem, cl_program, cl_kernel, cl_event,
 * command queues, contexts) created while armed are tracked with their
 * reference counts through the wrapped retain/release calls, so that the test
 * can count the ones still alive. */
#ifndef FLASHCL_FAULT_SHIM_H
#define FLASHCL_FAULT_SHIM_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

typedef enum fault_fn {
  FAULT_CREATE_BUFFER = 0,    /* clCreateBuffer: CL_MEM_OBJECT_ALLOCATION_FAILURE */
  FAULT_CREATE_PROGRAM_SOURCE, /* clCreateProgramWithSource: CL_OUT_OF_HOST_MEMORY */
  FAULT_CREATE_PROGRAM_BINARY, /* clCreateProgramWithBinary: CL_OUT_OF_HOST_MEMORY */
  FAULT_BUILD_PROGRAM,        /* clBuildProgram: CL_BUILD_PROGRAM_FAILURE */
  FAULT_CREATE_KERNEL,        /* clCreateKernel: CL_OUT_OF_RESOURCES */
  FAULT_SET_KERNEL_ARG,       /* clSetKernelArg: CL_OUT_OF_RESOURCES */
  FAULT_ENQUEUE_KERNEL,       /* clEnqueueNDRangeKernel: CL_OUT_OF_RESOURCES */
  FAULT_CREATE_CONTEXT,       /* clCreateContext: CL_OUT_OF_HOST_MEMORY */
  FAULT_CREATE_QUEUE,         /* clCreateCommandQueue: CL_OUT_OF_HOST_MEMORY */
  FAULT_MALLOC,               /* the library's malloc: NULL */
  FAULT_CALLOC,               /* the library's calloc: NULL */
  FAULT_REALLOC,              /* the library's realloc: NULL, the block kept */
  FAULT_FN_COUNT
} fault_fn;

typedef enum fault_kind { FK_MEM, FK_PROGRAM, FK_KERNEL, FK_EVENT, FK_QUEUE, FK_CONTEXT, FK_COUNT } fault_kind;

const char *fault_fn_name(int fn);
const char *fault_kind_name(int kind);

/* Starts counting (every function's counter from 0); the nth call (1-based)
 * of fn fails; nth 0 fails nothing. */
void fault_arm(int fn, long nth);
/* Stops counting; the counts stay readable. */
void fault_disarm(void);
/* Calls of fn reached since the last fault_arm. */
long fault_count(int fn);
/* The armed failure happened. */
int fault_fired(void);
/* Tracked objects of kind still alive (created while armed, not released). */
long fault_live(int kind);
/* The library's allocations not freed (since the process started). */
long fault_live_allocs(void);

#endif
