/* Forced in front of every source of the test-only library flashcl_faultable
 * (`-include`, see the top-level CMakeLists.txt and docs/reliability.md,
 * "Fault injection"): the library's own malloc/calloc/realloc/free calls go to
 * tests/fault_shim.c, which counts them and can fail the Nth. Only the library's
 * objects are compiled with this header, so PoCL, CLBlast and libc allocate
 * as usual. <stdlib.h> comes first so that its declarations are untouched and
 * later includes of it are no-ops. */
#ifndef FLASHCL_FAULT_ALLOC_H
#define FLASHCL_FAULT_ALLOC_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void *fault_malloc(size_t n);
void *fault_calloc(size_t n, size_t size);
void *fault_realloc(void *p, size_t n);
void fault_free(void *p);

#define malloc(n) fault_malloc(n)
#define calloc(n, size) fault_calloc(n, size)
#define realloc(p, n) fault_realloc(p, n)
#define free(p) fault_free(p)

#endif
