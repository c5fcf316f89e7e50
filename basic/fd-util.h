/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

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

/* A directory stream of dir_fd's directory from its start, on a copy of
 * the descriptor, so that dir_fd stays open and where it was. NULL with
 * errno set on failure. */
static inline DIR *opendir_dup(int dir_fd) {
        int fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 3);
        DIR *d;

        if (fd < 0)
                return NULL;
        d = fdopendir(fd);
        if (!d) {
                int saved = errno;

                (void) close(fd);
                errno = saved;
                return NULL;
        }
        rewinddir(d);
        return d;
}
