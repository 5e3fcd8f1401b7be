/* The arithmetic of live values: a set sensor's triangle wave, and the energy a GPU draws
 * under the power it was set to. Pure functions of what the journal set (fnv_live), used
 * by the replay (journal.c: energy is folded in before each power change) and by the
 * getters (sensors.c). */
#include <time.h>

#include "fake.h"

uint64_t fnv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The triangle wave's shape: 0 -> 1 over the first half period, back over the second. */
static double triangle(double phase) {
    double f = phase - (double)(uint64_t)phase;
    return f <= 0.5 ? 2 * f : 2 - 2 * f;
}

/* Its integral from 0 to x periods (each period contributes 1/2). */
static double triangle_area(double x) {
    double whole = (double)(uint64_t)x, f = x - whole;
    return whole * 0.5 + (f <= 0.5 ? f * f : 0.5 - (1 - f) * (1 - f));
}

/* Periods elapsed at t since the wave began (CLOCK_MONOTONIC is one clock for every
 * process on the host, containers included, so all readers see the same phase). */
static double periods(const fnv_wave *w, uint64_t t) {
    return t > w->since_ns ? (double)(t - w->since_ns) / ((double)w->period_ms * 1e6) : 0;
}

uint64_t fnv_wave_at(const fnv_wave *w, uint64_t t) {
    double from = (double)w->from, to = (double)w->to;
    return (uint64_t)(from + (to - from) * triangle(periods(w, t)) + 0.5);
}

/* mJ drawn between t0 and t1 (ns) at the power `w` says (mW * s = mJ). */
double fnv_energy_between(const fnv_device *d, const fnv_wave *w, uint64_t t0, uint64_t t1) {
    if (t1 <= t0) return 0;
    double seconds = (double)(t1 - t0) / 1e9;
    if (!w->set) return (double)d->power_usage_mw * seconds;
    if (!w->period_ms) return (double)w->from * seconds;
    double from = (double)w->from, to = (double)w->to, p_s = (double)w->period_ms / 1e3;
    return from * seconds +
           (to - from) * p_s * (triangle_area(periods(w, t1)) - triangle_area(periods(w, t0)));
}

void fnv_energy_fold(fnv_state *st, uint32_t gpu, uint64_t at_ns) {
    fnv_live *l = &st->live[gpu];
    if (at_ns <= l->energy_ns) return;
    l->energy_mj +=
        fnv_energy_between(&st->devices[gpu], &l->sensor[FNV_S_POWER], l->energy_ns, at_ns);
    l->energy_ns = at_ns;
}
