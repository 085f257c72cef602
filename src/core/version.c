/* The library's own version, for programs that link libflashcl dynamically
 * and must check it against the header they were built with. */
#include "core/internal.h"

unsigned flashcl_version_number(void) { return FLASHCL_VERSION_NUMBER; }

const char *flashcl_version_string(void) { return FLASHCL_VERSION_STRING; }
