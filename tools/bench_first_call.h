/* flashcl-bench --first-call (bench_first_call.c). */
#ifndef FLASHCL_BENCH_FIRST_CALL_H
#define FLASHCL_BENCH_FIRST_CALL_H

#include "common.h"

int bench_first_call_main(int argc, char **argv);

#endif
