/* The context's mutex and the one atomic increment of the thread-safety rules
 * (include/flashcl.h, "Conventions"): pthreads on POSIX, an SRWLOCK on
 * Windows. Not recursive: a public entry point never calls another one while
 * it holds its context's lock (internal variants exist where it would). */
#ifndef FLASHCL_LOCK_H
#define FLASHCL_LOCK_H

#include <stdint.h>

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
typedef SRWLOCK fcl_mutex;
static inline int fcl_mutex_init(fcl_mutex *m) {
  InitializeSRWLock(m);
  return 0;
}
static inline void fcl_mutex_destroy(fcl_mutex *m) { (void)m; }
static inline void fcl_mutex_lock(fcl_mutex *m) { AcquireSRWLockExclusive(m); }
static inline void fcl_mutex_unlock(fcl_mutex *m) { ReleaseSRWLockExclusive(m); }
/* Adds 1 to *p atomically and returns the new value. */
static inline int64_t fcl_atomic_inc(volatile int64_t *p) { return InterlockedIncrement64((volatile LONG64 *)p); }
#else
#include <pthread.h>
typedef pthread_mutex_t fcl_mutex;
static inline int fcl_mutex_init(fcl_mutex *m) { return pthread_mutex_init(m, NULL); }
static inline void fcl_mutex_destroy(fcl_mutex *m) { pthread_mutex_destroy(m); }
static inline void fcl_mutex_lock(fcl_mutex *m) { pthread_mutex_lock(m); }
static inline void fcl_mutex_unlock(fcl_mutex *m) { pthread_mutex_unlock(m); }
static inline int64_t fcl_atomic_inc(volatile int64_t *p) { return __atomic_add_fetch(p, 1, __ATOMIC_RELAXED); }
#endif

#endif
