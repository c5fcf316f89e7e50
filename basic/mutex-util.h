/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <pthread.h>

#include "cleanup.h"

static inline void mutex_unlockp(pthread_mutex_t **m) {
        if (*m)
                pthread_mutex_unlock(*m);
}

static inline pthread_mutex_t *mutex_lock_ptr(pthread_mutex_t *m) {
        pthread_mutex_lock(m);
        return m;
}

/* Holds the mutex until the end of the enclosing scope. */
#define MUTEX_GUARD_CONCAT2(a, b) a##b
#define MUTEX_GUARD_CONCAT(a, b) MUTEX_GUARD_CONCAT2(a, b)
#define MUTEX_LOCKED(m)                                                              \
        _cleanup_(mutex_unlockp) _unused_ pthread_mutex_t *MUTEX_GUARD_CONCAT(_guard_, __LINE__) = \
                mutex_lock_ptr(m)
