/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <poll.h>

/* Waits until fd has input (or its other end closed): 1, 0 at the
 * timeout (-1: none), or a negative errno. */
static inline int fd_wait_readable(int fd, int timeout_ms) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r;

        do
                r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : r;
}
