/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file a command writes its output to (a send stream). A regular file is
 * written under a temporary name beside it and renamed over it once all is
 * written, so that a command that fails leaves what was there before. One
 * in a directory the caller may not write to is written in place, from its
 * start, and cut to what was written at the end: a command that fails
 * before it writes still leaves it as it was. Anything else (a FIFO, a
 * terminal, /dev/null) is written as it is, never removed or synced. */
typedef struct OutputFile {
        int fd;
        char *path;             /* where a temporary file goes in the end */
        char *temp;             /* NULL: written in place */
        bool regular_in_place;
} OutputFile;

static inline void output_file_abort(OutputFile *f) {
        if (f->fd >= 0)
                (void) close(f->fd);
        if (f->temp)
                (void) unlink(f->temp);
        free(f->temp);
        free(f->path);
        *f = (OutputFile) { .fd = -EBADF };
}

static inline int output_file_open(const char *path, OutputFile *ret) {
        OutputFile f = { .fd = -EBADF };
        const char *base;
        struct stat st;
        mode_t mask;
        int r;

        *ret = f;
        if (stat(path, &st) >= 0 && !S_ISREG(st.st_mode)) {
                f.fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
                if (f.fd < 0)
                        return -errno;
                *ret = f;
                return 0;
        }
        /* Through a symbolic link: the file it points to is replaced. */
        f.path = realpath(path, NULL);
        if (!f.path && errno != ENOENT)
                return -errno;
        if (!f.path && !(f.path = strdup(path)))
                return -ENOMEM;
        base = strrchr(f.path, '/');
        base = base ? base + 1 : f.path;
        if (asprintf(&f.temp, "%.*s.%s.XXXXXX", (int) (base - f.path), f.path, base) < 0) {
                f.temp = NULL;
                output_file_abort(&f);
                return -ENOMEM;
        }
        f.fd = mkostemp(f.temp, O_CLOEXEC);
        if (f.fd < 0) {
                r = -errno;
                free(f.temp);
                f.temp = NULL;
                if (r == -EACCES || r == -EPERM || r == -EROFS) {
                        f.fd = open(f.path, O_WRONLY | O_CLOEXEC);
                        if (f.fd >= 0) {
                                f.regular_in_place = true;
                                *ret = f;
                                return 0;
                        }
                }
                output_file_abort(&f);
                return r;
        }
        /* As open(O_CREAT, 0644) would have made it. */
        mask = umask(0);
        umask(mask);
        if (fchmod(f.fd, 0644 & ~mask) < 0) {
                r = -errno;
                output_file_abort(&f);
                return r;
        }
        *ret = f;
        return 0;
}

/* Everything is written: the file takes its place, on the disk. */
static inline int output_file_commit(OutputFile *f) {
        int r = 0;

        if (f->temp) {
                if (fsync(f->fd) < 0 || rename(f->temp, f->path) < 0)
                        r = -errno;
                else {
                        free(f->temp);
                        f->temp = NULL;
                }
        } else if (f->regular_in_place) {
                off_t end = lseek(f->fd, 0, SEEK_CUR);

                if (end < 0 || ftruncate(f->fd, end) < 0 || fsync(f->fd) < 0)
                        r = -errno;
        }
        output_file_abort(f);
        return r;
}
