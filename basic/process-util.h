/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "cleanup.h"
#include "string-util.h"

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

/* What tells a process apart from a later one with the same PID: the
 * machine's boot and the process's start time (clock ticks after boot,
 * field 22 of /proc/PID/stat). */
typedef struct ProcessIdentity {
        pid_t pid;
        unsigned long long start_time;
        char boot_id[40];
        char state;             /* field 3: 'Z' or 'X' for one that is gone but for its entry */
} ProcessIdentity;

static inline int process_identity(pid_t pid, ProcessIdentity *ret) {
        _cleanup_fclose_ FILE *stat = NULL, *boot = NULL;
        char path[64], line[1024], *p;

        *ret = (ProcessIdentity) { .pid = pid };
        snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        stat = fopen(path, "re");
        if (!stat)
                return errno == ENOENT ? -ESRCH : -errno;
        if (!fgets(line, sizeof line, stat))
                return -EIO;
        /* The name may hold spaces and parentheses: fields follow the last ')'. */
        p = strrchr(line, ')');
        if (!p || sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                         &ret->state, &ret->start_time) != 2)
                return -EIO;
        boot = fopen("/proc/sys/kernel/random/boot_id", "re");
        if (!boot || !fgets(ret->boot_id, sizeof ret->boot_id, boot))
                return -EIO;
        ret->boot_id[strcspn(ret->boot_id, "\n")] = 0;
        return 0;
}

/* Whether the process id names still runs (a zombie does not). */
static inline bool process_identity_alive(const ProcessIdentity *id) {
        ProcessIdentity now;

        if (process_identity(id->pid, &now) < 0 || now.state == 'Z' || now.state == 'X')
                return false;
        return now.start_time == id->start_time && streq(now.boot_id, id->boot_id);
}
