/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <string.h>

static inline bool streq(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}

static inline bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static inline bool endswith(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);

        return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* "." or "..", the names no directory entry may take. */
static inline bool streq_dot(const char *s) {
        return s[0] == '.' && (s[1] == 0 || (s[1] == '.' && s[2] == 0));
}

/* Iterates over a list of string literals. */
#define FOREACH_STRING(x, ...)                                                      \
        for (const char *const *_l_ = (const char *const[]) { __VA_ARGS__, NULL }, *x; \
             (x = *_l_); _l_++)

/* A yes or no as a command line gives it: true, yes, on or 1, or false,
 * no, off or 0. 1, 0, or -1 for anything else. */
static inline int parse_boolean(const char *text) {
        FOREACH_STRING(yes, "true", "yes", "on", "1")
                if (streq(text, yes))
                        return 1;
        FOREACH_STRING(no, "false", "no", "off", "0")
                if (streq(text, no))
                        return 0;
        return -1;
}

/* Whether path is made of slashes only: the root, however written. */
static inline bool path_is_root(const char *path) {
        return path[0] == '/' && !path[strspn(path, "/")];
}

/* Whether a component of path is "..", or, with dot, ".". */
static inline bool path_has_dot_component(const char *path, bool dot) {
        for (const char *p = path; *p;) {
                size_t n = strcspn(p, "/");

                if ((n == 2 && p[0] == '.' && p[1] == '.') || (dot && n == 1 && p[0] == '.'))
                        return true;
                p += n + (p[n] == '/');
        }
        return false;
}

/* Undoes the octal escapes (\040 for a space) of a field of
 * /proc/self/mountinfo, in place. */
static inline void mountinfo_unescape(char *s) {
        char *out = s;

        for (char *p = s; *p; p++) {
                if (p[0] == '\\' && p[1] >= '0' && p[1] <= '7' && p[2] && p[3]) {
                        *out++ = (char) (((p[1] - '0') << 6) | ((p[2] - '0') << 3) | (p[3] - '0'));
                        p += 3;
                } else
                        *out++ = *p;
        }
        *out = 0;
}
