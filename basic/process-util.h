/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "cleanup.h"

/* Whether a process is gone, or dying (a zombie): it holds its locks and
 * mounts until its last thread is gone. */
static inline bool process_is_exiting(pid_t pid) {
        _cleanup_fclose_ FILE *f = NULL;
        char path[64], state = 0;

        snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        f = fopen(path, "re");
        if (!f)
                return true;
        if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1)
                return false;
        return state == 'Z' || state == 'X';
}
