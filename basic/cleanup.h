/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Scope-bound resource helpers, in the manner of systemd's macro.h: a
 * variable declared _cleanup_free_ is freed when it goes out of scope, and
 * TAKE_PTR()/TAKE_FD() hand ownership on explicitly.
 */

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _pure_ __attribute__((pure))
#define _noreturn_ __attribute__((noreturn))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _public_ __attribute__((visibility("default")))
#define _fallthrough_ __attribute__((fallthrough))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)
#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(x, y) (((x) + (y) - 1) / (y))

/* Returns the value of *p and sets *p to its null value, in one expression. */
#define TAKE_GENERIC(var, type, nullvalue)                        \
        ({                                                        \
                type *_pvar_ = &(var);                            \
                type _var_ = *_pvar_;                             \
                *_pvar_ = (nullvalue);                            \
                _var_;                                            \
        })
#define TAKE_PTR(p) TAKE_GENERIC((p), __typeof__(p), NULL)
#define TAKE_FD(fd) TAKE_GENERIC((fd), int, -EBADF)

/* Defines name##p(), a cleanup function that calls func on *p unless it is NULL. */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)                   \
        static inline void func##p(type *p) {                     \
                if (*p)                                           \
                        func(*p);                                 \
        }

static inline void freep(void *p) {
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -EBADF;
}

static inline void closep(int *fd) {
        safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline void fclosep(FILE **f) {
        if (*f)
                (void) fclose(*f);
}
#define _cleanup_fclose_ _cleanup_(fclosep)

static inline void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}
#define _cleanup_closedir_ _cleanup_(closedirp)

/* Frees a NULL-terminated array of strings and the array itself. */
static inline void strv_free(char **l) {
        if (!l)
                return;
        for (char **i = l; *i; i++)
                free(*i);
        free(l);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(char **, strv_free);
#define _cleanup_strv_free_ _cleanup_(strv_freep)

/* errno as a negative value, never 0, for the "return -errno" convention. */
static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}
