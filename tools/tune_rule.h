/* The rule by which flashcl-tune calls one timed configuration faster than
 * another (the search's steps, its final comparison, --against's summary). */
#ifndef FLASHCL_TUNE_RULE_H
#define FLASHCL_TUNE_RULE_H

/* Whether B's median (b_ms) beats A's (a_ms) by the search's rule: by more
 * than twice the larger noise of the two sides (interquartile range over the
 * median), at least 0.3% and at most 1%, and in at least 3 of every 4
 * rounds (b_wins of rounds). A step smaller than its own timings' spread is
 * never kept; on a quiet device the search still sees steps under 1%. */
int tune_faster(double a_ms, double a_noise, double b_ms, double b_noise, int b_wins, int rounds);

#endif
