/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Claims: work a process does under temporary names, which a crash leaves
 * behind (a receive's images before they take their names), is claimed
 * under a name of its own for as long as the process lives. A claim is an
 * exclusive flock() of locks/claim-NAME.lock: the kernel releases it when
 * its holder dies, however it dies, and it means the same from every PID
 * namespace and after the PID is reused, which a PID written in a name
 * does not.
 *
 * The store keeps the descriptors of its own claims: a child forked
 * without exec() closes them with the store (store_close_inherited()), so
 * that a background reaper does not keep its parent's claim alive.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fd-util.h"
#include "store-internal.h"
#include "string-util.h"

#define CLAIM_NAME_MAX 64
#define CLAIM_BUSY_ATTEMPTS 200
#define CLAIM_BUSY_RETRY_USEC 5000

struct StoreClaim {
        StoreClaim *next;
        char *name;
        int fd;
};

static bool claim_name_is_valid(const char *claim) {
        size_t n = claim ? strlen(claim) : 0;

        return n > 0 && n <= CLAIM_NAME_MAX && strspn(claim, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

static void claim_file_name(const char *claim, char ret[static CLAIM_NAME_MAX + 16]) {
        snprintf(ret, CLAIM_NAME_MAX + 16, "claim-%s.lock", claim);
}

/* Whether fd is the file the name links to now. */
static bool fd_is_linked_as(int fd, int dir_fd, const char *name) {
        struct stat st, now;

        return fstat(fd, &st) >= 0 && st.st_nlink > 0 && fstatat(dir_fd, name, &now, AT_SYMLINK_NOFOLLOW) >= 0 &&
               st.st_dev == now.st_dev && st.st_ino == now.st_ino;
}

/* Opens and locks the claim's file. One that a clearing removed between
 * the open and the lock is opened anew: a lock on a file no longer there
 * claims nothing. A clearing or a look holds the lock of a claim nobody
 * holds for an instant only: only one held on is another's. */
static int claim_lock_file(Store *s, const char *file) {
        for (unsigned busy = 0;;) {
                _cleanup_close_ int fd = -EBADF;

                fd = openat(s->locks_fd, file, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0)
                        return -errno;
                if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                        if (errno != EWOULDBLOCK)
                                return -errno;
                        if (++busy >= CLAIM_BUSY_ATTEMPTS)
                                return -EEXIST;
                        (void) usleep(CLAIM_BUSY_RETRY_USEC);
                        continue;
                }
                if (fd_is_linked_as(fd, s->locks_fd, file))
                        return TAKE_FD(fd);
        }
}

int store_claim(Store *s, const char *claim) {
        char file[CLAIM_NAME_MAX + 16];
        StoreClaim *c;
        int fd;

        if (!claim_name_is_valid(claim))
                return -EINVAL;
        claim_file_name(claim, file);
        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->name = strdup(claim);
        if (!c->name) {
                free(c);
                return -ENOMEM;
        }
        fd = claim_lock_file(s, file);
        if (fd < 0) {
                free(c->name);
                free(c);
                return fd;
        }
        c->fd = fd;

        MUTEX_LOCKED(&s->claims_lock);
        c->next = s->claims;
        s->claims = c;
        return 0;
}

static StoreClaim *claim_free(StoreClaim *c) {
        StoreClaim *next = c->next;

        safe_close(c->fd);
        free(c->name);
        free(c);
        return next;
}

int store_claim_release(Store *s, const char *claim) {
        char file[CLAIM_NAME_MAX + 16];

        if (!claim_name_is_valid(claim))
                return -EINVAL;
        claim_file_name(claim, file);

        MUTEX_LOCKED(&s->claims_lock);
        for (StoreClaim **p = &s->claims; *p; p = &(*p)->next)
                if (streq((*p)->name, claim)) {
                        /* Removed while held: nobody can take the file for
                         * free in between. */
                        (void) unlinkat(s->locks_fd, file, 0);
                        *p = claim_free(*p);
                        return 0;
                }
        return -ENOENT;
}

void store_claims_close(Store *s) {
        MUTEX_LOCKED(&s->claims_lock);
        while (s->claims)
                s->claims = claim_free(s->claims);
}

int store_claim_is_held(Store *s, const char *claim) {
        _cleanup_close_ int fd = -EBADF;
        char file[CLAIM_NAME_MAX + 16];

        if (!claim_name_is_valid(claim))
                return -EINVAL;
        claim_file_name(claim, file);
        fd = openat(s->locks_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) >= 0)
                return 0;
        return errno == EWOULDBLOCK ? 1 : -errno;
}

int store_claims_clear(Store *s, const char *prefix) {
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        char start[CLAIM_NAME_MAX + 16];
        int removed = 0;

        if (!prefix || strlen(prefix) > CLAIM_NAME_MAX)
                return -EINVAL;
        snprintf(start, sizeof start, "claim-%s", prefix);
        d = opendir_dup(s->locks_fd);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                _cleanup_close_ int fd = -EBADF;

                if (!startswith(de->d_name, start) || !endswith(de->d_name, ".lock"))
                        continue;
                fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0)
                        continue;
                /* Only the file locked: another clearing may have removed
                 * it since the open, and a claim taken a new one. */
                if (fd_is_linked_as(fd, dirfd(d), de->d_name) && unlinkat(dirfd(d), de->d_name, 0) >= 0)
                        removed++;
        }
        return removed;
}
