/* The declared tuning spaces and the lookup of a configuration (src/core/tuning_space.c,
 * src/core/tuning_db.c). Each family's parameters are named here by index, in the
 * order of their declaration in tuning_space.c, so that the runtime reads a
 * value as fcl_tuned_get(&t, FCL_FWD_BR, rule) while files, per-call tunings
 * and flashcl-tune use the names. */
#ifndef FLASHCL_TUNING_H
#define FLASHCL_TUNING_H

#include "core/internal.h"

enum { /* fwd: the portable forward */
  FCL_FWD_MAP, FCL_FWD_BR, FCL_FWD_BC, FCL_FWD_THREADS, FCL_FWD_S_TM, FCL_FWD_S_TN, FCL_FWD_O_TM, FCL_FWD_O_TD,
  FCL_FWD_TALL, FCL_FWD_UNROLL_D, FCL_FWD_PREFETCH, FCL_FWD_PAD, FCL_FWD_UNROLL_O, FCL_FWD_FTZ, FCL_FWD_SEP_KV,
  FCL_FWD_SHFL, FCL_FWD_COUNT
};
enum { /* bwd: the portable backward */
  FCL_BWD_BC, FCL_BWD_BR, FCL_BWD_THREADS, FCL_BWD_DQ_BC, FCL_BWD_DQ_BR, FCL_BWD_DQ_THREADS, FCL_BWD_WARP,
  FCL_BWD_SPLIT, FCL_BWD_UNROLL, FCL_BWD_FTZ, FCL_BWD_AHEAD, FCL_BWD_RED, FCL_BWD_SHFL, FCL_BWD_NBAR,
  FCL_BWD_CONCURRENT, FCL_BWD_COUNT
};
enum { /* mma_fwd */
  FCL_MMAF_NWARPS, FCL_MMAF_M_TILES, FCL_MMAF_BLOCK_C, FCL_MMAF_Q_IN_SMEM, FCL_MMAF_KV_STAGES, FCL_MMAF_COUNT
};
enum { /* mma_bwd */
  FCL_MMAB_NWARPS, FCL_MMAB_BLOCK_R, FCL_MMAB_M_TILES, FCL_MMAB_BLOCK_C, FCL_MMAB_QBUF, FCL_MMAB_VEC_RED,
  FCL_MMAB_V_IN_SMEM, FCL_MMAB_DQ_SPLITS, FCL_MMAB_KV_PARTS, FCL_MMAB_WGMMA, FCL_MMAB_BULK_DQ, FCL_MMAB_DQ_NWG,
  FCL_MMAB_DQ_BLOCK_C, FCL_MMAB_ATOMIC_DQ, FCL_MMAB_COUNT
};
enum { /* wgmma_fwd */
  FCL_WG_USE, FCL_WG_NWG, FCL_WG_BLOCK_C, FCL_WG_STAGES, FCL_WG_COUNT
};
enum { /* decode */
  FCL_DEC_P_KPT, FCL_DEC_P_PREFETCH, FCL_DEC_P_WG_PER_CU, FCL_DEC_P_THREADS, FCL_DEC_P_MAX_ROWS, FCL_DEC_P_STAGES,
  FCL_DEC_P_MIN_KEYS, FCL_DEC_P_MMA_MIN_ROWS, FCL_DEC_P_MMA_WG_PER_CU, FCL_DEC_P_MMA_WK, FCL_DEC_P_MMA_STAGES,
  FCL_DEC_P_MMA_MIN_KEYS, FCL_DEC_P_MERGE, FCL_DEC_P_MAP, FCL_DEC_P_CPU_BLOCK_C, FCL_DEC_P_CPU_ROWS, FCL_DEC_P_COUNT
};
enum { /* device: context-wide */
  FCL_DEV_LOCAL_MEM, FCL_DEV_LOCAL_PROBE, FCL_DEV_BINARY_CACHE, FCL_DEV_COUNT
};

#define FCL_TUNE_MAX FLASHCL_TUNING_MAX_PARAMS

/* One family's declared space (src/core/tuning_space.c). */
typedef struct fcl_param_decl {
  const char *name, *description;
  int min, max, step;
  const int *cand;
  int ncand;
} fcl_param_decl;

/* The declarations of a family and their count; NULL for an unknown family. */
const fcl_param_decl *fcl_tuning_decls(flashcl_tuning_family family, int *count);
/* The index of a declared name in the family, or -1. */
int fcl_tuning_index(flashcl_tuning_family family, const char *name);
/* flashcl_tuning_parse with ctx's lock held or not needed (the tuning files'
 * loading while the context is created). */
flashcl_status fcl_tuning_parse_locked(flashcl_context *ctx, const char *text, flashcl_tuning *tuning);
/* 1 if value is legal for the declaration. */
int fcl_tuning_legal(const fcl_param_decl *d, int value);

/* What a problem looks like to the database: entries may be keyed on each. */
typedef struct fcl_tune_key {
  int head_dim;
  flashcl_dtype dtype;
  int causal; /* causal or a window */
  int atomic; /* backward: the atomic dQ; -1 elsewhere */
  long n;     /* keys per sequence (decode: the planned maximum) */
} fcl_tune_key;

/* A resolved configuration: the values the sources set, and where from. The
 * family's code reads them with fcl_tuned_get and records what it really ran
 * with fcl_tuned_ran, which flashcl_attention_config reports. */
typedef struct fcl_tuned {
  flashcl_tuning_family family;
  flashcl_tuning_source source;
  char origin[256];
  int set[FCL_TUNE_MAX], val[FCL_TUNE_MAX];
  int call[FCL_TUNE_MAX]; /* set by the call (desc.algorithm.tuning, desc.algorithm.block_r/c): must run as given */
  int ran[FCL_TUNE_MAX];
} fcl_tuned;

/* Resolves family's configuration for key: call (desc.algorithm.tuning, nullable), then
 * the context's tables, first match wins; none leaves every value unset
 * (source DEFAULT). call must be of `family` (the caller checks). */
void fcl_tuning_resolve(const flashcl_context *ctx, flashcl_tuning_family family, const flashcl_tuning *call,
                        const fcl_tune_key *key, fcl_tuned *out);

static inline int fcl_tuned_get(const fcl_tuned *t, int index, int rule) {
  return t->set[index] ? t->val[index] : rule;
}
static inline int fcl_tuned_has(const fcl_tuned *t, int index) { return t->set[index]; }
static inline void fcl_tuned_ran(fcl_tuned *t, int index, int value) { t->ran[index] = value; }

/* Applies desc.algorithm.block_r / block_c (0: not given) as br / bc of a fwd or bwd
 * tuning: INVALID_ARGUMENT unless both are 0 or positive multiples of 8 (the
 * plan refuses tiles that do not fit with UNSUPPORTED). */
flashcl_status fcl_tuned_blocks(flashcl_context *ctx, fcl_tuned *t, int block_r, int block_c);

/* What the call set must run as given: FLASHCL_ERROR_UNSUPPORTED, naming the
 * first parameter whose value did not run (it did not fit, or the kernel it
 * belongs to does not run), when a value the call set (desc.algorithm.tuning,
 * desc.algorithm.block_r/c) differs from the `ran` value. Values from files and the
 * database are a preference. */
flashcl_status fcl_tuned_honoured(flashcl_context *ctx, const fcl_tuned *t);

/* Fills a flashcl_config's family, source, origin and tuning (every declared
 * parameter, at its `ran` value). */
void fcl_tuned_report(const fcl_tuned *t, flashcl_config *config);

/* The family a call's tuning asks for, checked against the pass: 0 and *family
 * = -1 with no tuning; FLASHCL_ERROR_UNSUPPORTED with a message when the tuning
 * is for a family that does not run this pass. */
flashcl_status fcl_tuning_call_family(flashcl_context *ctx, const flashcl_tuning *call, flashcl_pass pass,
                                      int decode, flashcl_tuning_family *family);

#endif
