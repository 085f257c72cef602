/* PTX retargeting for the Hopper-only instructions (src/nvidia/ptx_sm90a.c). Kept
 * apart from internal.h: it needs no OpenCL, and tests/test_ptx_sm90a.c
 * compiles it directly. */
#ifndef FLASHCL_PTX_SM90A_H
#define FLASHCL_PTX_SM90A_H

/* What cl/nvidia/flash_fwd_wgmma.cl writes in front of each sm_90a-only instruction. */
#define FCL_SM90A_MARKER "//@sm90a@ "

/* The rewrite's revision: part of the on-disk program cache's key for the
 * sm_90a route (src/core/program.c), whose entries are looked up before the rewrite
 * runs. Raise it whenever fcl_ptx_to_sm90a's output changes. */
#define FCL_PTX_SM90A_REVISION 1

/* A malloc'ed copy of ptx with every FCL_SM90A_MARKER deleted and its
 * `.target sm_90` raised to `.target sm_90a`. NULL, with *why set to a static
 * reason, when the module does not target exactly sm_90, has no marker, or
 * memory runs out. */
char *fcl_ptx_to_sm90a(const char *ptx, const char **why);

#endif
