/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* The decimal number in environment variable name, ignored in processes
 * that gained privileges (secure_getenv()). -ENXIO if unset, -EINVAL if
 * not a number. */
static inline int secure_getenv_uint64(const char *name, uint64_t *ret) {
        const char *e = secure_getenv(name);
        unsigned long long n;
        char *end;

        if (!e)
                return -ENXIO;
        errno = 0;
        n = strtoull(e, &end, 10);
        if (errno != 0 || end == e || *end != 0)
                return -EINVAL;
        *ret = (uint64_t) n;
        return 0;
}
