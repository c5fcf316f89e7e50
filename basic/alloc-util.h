/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Makes room for need elements of size bytes in *p, doubling (at least 16
 * elements). false if out of memory; *p is then left as it was. */
static inline bool greedy_realloc(void **p, size_t *allocated, size_t need, size_t size) {
        size_t n;
        void *q;

        if (need <= *allocated)
                return true;
        n = need < 8 ? 16 : need * 2;
        if (n > SIZE_MAX / size)
                return false;
        q = realloc(*p, n * size);
        if (!q)
                return false;
        *p = q;
        *allocated = n;
        return true;
}

#define GREEDY_REALLOC(array, allocated, need) \
        greedy_realloc((void **) &(array), &(allocated), (need), sizeof((array)[0]))
