/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
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

/* Opens the directory at an absolute path as O_PATH, one component at a
 * time, following no symbolic link on the way: -ENOTDIR (or -ELOOP) where
 * one is, so that a directory whose parents someone else may change is
 * the one named, not where a link swapped in meanwhile points. */
static inline int open_dir_nofollow(const char *path) {
        int fd;

        if (path[0] != '/')
                return -EINVAL;
        fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        for (const char *p = path; *p;) {
                char component[256];
                size_t n;
                int next;

                p += strspn(p, "/");
                n = strcspn(p, "/");
                if (n == 0)
                        break;
                if (n >= sizeof component) {
                        (void) close(fd);
                        return -ENAMETOOLONG;
                }
                memcpy(component, p, n);
                component[n] = 0;
                p += n;
                next = openat(fd, component, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0) {
                        int r = -errno;

                        (void) close(fd);
                        return r;
                }
                (void) close(fd);
                fd = next;
        }
        return fd;
}
