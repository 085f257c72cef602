/* The files embedded into the library at build time (cmake/embed_sources.cmake):
 * the kernel sources (cl/) and the built-in tuning database (tuning/). */
#ifndef FLASHCL_EMBEDDED_H
#define FLASHCL_EMBEDDED_H

#include <stddef.h>

struct fcl_embedded {
  const char *name; /* the file name the library looks it up by */
  const char *path; /* its path under cl/ or tuning/ */
  const char *text; /* NUL-terminated */
  size_t size;      /* bytes, without the NUL */
};
/* Each table ends with an entry whose name is NULL. */
extern const struct fcl_embedded flashcl_embedded_sources[];
extern const struct fcl_embedded flashcl_embedded_tuning[];

#endif
