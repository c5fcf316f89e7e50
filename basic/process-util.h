/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

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

/* The PID namespace of the caller: PIDs of records written in another mean
 * nothing here. */
static inline unsigned long long pid_namespace_id(void) {
        struct stat st;

        return stat("/proc/self/ns/pid", &st) < 0 ? 0 : (unsigned long long) st.st_ino;
}

/* The caller's identity as the text that records outliving it keep:
 * "PID START-TIME BOOT-ID PID-NAMESPACE". */
#define PROCESS_IDENTITY_TEXT_MAX 128

static inline int process_identity_text_self(char ret[static PROCESS_IDENTITY_TEXT_MAX]) {
        ProcessIdentity self;
        int r;

        r = process_identity(getpid(), &self);
        if (r < 0)
                return r;
        snprintf(ret, PROCESS_IDENTITY_TEXT_MAX, "%d %llu %s %llu", (int) self.pid, self.start_time, self.boot_id,
                 pid_namespace_id());
        return 0;
}

/* Whether the process such a text names still runs: 1 if so, 0 if not,
 * -EINVAL for a text that is none, -EXDEV for one of another PID
 * namespace, which cannot be told from here. A text without the
 * namespace is taken as of this one. */
static inline int process_identity_text_alive(const char *text, pid_t *ret_pid) {
        ProcessIdentity id = {};
        unsigned long long pidns = 0;
        int pid, n;

        n = sscanf(text, "%d %llu %39s %llu", &pid, &id.start_time, id.boot_id, &pidns);
        if (n < 3 || pid <= 0)
                return -EINVAL;
        id.pid = pid;
        if (ret_pid)
                *ret_pid = pid;
        if (n == 4 && pidns != pid_namespace_id())
                return -EXDEV;
        return process_identity_alive(&id);
}
