/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * What went wrong where nobody asked: a mount's server or a reaper at work
 * on its own. Lines go to standard error: a terminal, the journal when
 * cowboxd runs under systemd, or, once a process left its caller
 * (store_log_to_file()), the store's file "log", where they carry the time.
 * Each line is one write() to a descriptor opened for appending, so lines
 * of several processes never mix.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fd-util.h"
#include "store-internal.h"

/* Past this size the log is renamed to log.old, once, by the next process
 * that opens it: the two hold the latest few thousand lines. */
#define LOG_MAX_BYTES (1024 * 1024)

static bool log_timestamps;

static int log_open(Store *s) {
        int fd = openat(s->dir_fd, STORE_LOG_FILE, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW,
                        0640);
        return fd < 0 ? -errno : fd;
}

int store_log_to_file(Store *s) {
        _cleanup_close_ int fd = -EBADF;
        struct stat st, named;

        fd = log_open(s);
        if (fd < 0)
                return fd;
        /* Moved aside only while it is still the file called log: another
         * process may have just done so. */
        if (fstat(fd, &st) == 0 && st.st_size > LOG_MAX_BYTES &&
            fstatat(s->dir_fd, STORE_LOG_FILE, &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == st.st_ino &&
            renameat(s->dir_fd, STORE_LOG_FILE, s->dir_fd, STORE_LOG_FILE ".old") == 0) {
                safe_close(fd);
                fd = log_open(s);
                if (fd < 0)
                        return fd;
        }
        if (dup2(fd, STDERR_FILENO) < 0)
                return -errno;
        log_timestamps = true;
        return 0;
}

void store_log(const char *format, ...) {
        char line[1024];
        size_t n = 0;
        va_list ap;
        int k;

        if (log_timestamps) {
                struct timespec ts;
                struct tm tm;

                (void) clock_gettime(CLOCK_REALTIME, &ts);
                if (gmtime_r(&ts.tv_sec, &tm))
                        n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ ", &tm);
        }
        k = snprintf(line + n, sizeof line - n, "%s[%d]: ", program_invocation_short_name, (int) getpid());
        n = MIN(n + (size_t) MAX(k, 0), sizeof line - 1);
        va_start(ap, format);
        k = vsnprintf(line + n, sizeof line - n, format, ap);
        va_end(ap);
        n = MIN(n + (size_t) MAX(k, 0), sizeof line - 2);
        line[n++] = '\n';
        (void) !write(STDERR_FILENO, line, n);
}
