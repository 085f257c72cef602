/* The tuner's "faster" rule (see tune_rule.h). The margin follows the
 * measured noise so that a quiet device can show steps under 1% (one that
 * decides a portable backward's last percent) while a noisy one never keeps
 * a change its own spread could explain; the 1% cap keeps the rule no
 * stricter than a fixed 1% was. */
#include "tune_rule.h"

int tune_faster(double a_ms, double a_noise, double b_ms, double b_noise, int b_wins, int rounds) {
  double margin = 2.0 * (a_noise > b_noise ? a_noise : b_noise);
  if (margin < 0.003) margin = 0.003;
  if (margin > 0.01) margin = 0.01;
  return b_ms < a_ms * (1.0 - margin) && b_wins * 4 >= rounds * 3;
}
