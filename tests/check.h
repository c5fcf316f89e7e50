/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Checks of the C tests: a failed one says where and what, and exits. Each
 * test defines test_name, which it may change as it goes. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr)                                                                       \
        do {                                                                              \
                if (!(expr)) {                                                            \
                        fprintf(stderr, "%s: %s:%d: check failed: %s\n", test_name,       \
                                __FILE__, __LINE__, #expr);                               \
                        exit(EXIT_FAILURE);                                               \
                }                                                                         \
        } while (0)

/* expr returns a negative errno on failure. */
#define CHECK_OK(expr)                                                                    \
        do {                                                                              \
                long long _r_ = (long long) (expr);                                       \
                if (_r_ < 0) {                                                            \
                        fprintf(stderr, "%s: %s:%d: %s failed: %s\n", test_name, __FILE__, \
                                __LINE__, #expr, strerror((int) -_r_));                   \
                        exit(EXIT_FAILURE);                                               \
                }                                                                         \
        } while (0)
