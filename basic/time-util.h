/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Microseconds of CLOCK_MONOTONIC: for intervals and deadlines. */
static inline uint64_t monotonic_usec(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

/* A point in time in microseconds as a timespec: the deadline of a
 * pthread_cond_timedwait() on a condition of the same clock. */
static inline struct timespec timespec_from_usec(uint64_t usec) {
        return (struct timespec) { .tv_sec = (time_t) (usec / 1000000u), .tv_nsec = (long) (usec % 1000000u) * 1000 };
}

/* Whether at least interval has passed since *last (then *last is now):
 * for progress reports that must not flood their reader. */
static inline bool ratelimit_due(uint64_t *last, uint64_t interval_usec, bool force) {
        uint64_t now = monotonic_usec();

        if (!force && now - *last < interval_usec)
                return false;
        *last = now;
        return true;
}
