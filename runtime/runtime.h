/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * runtime.h: sandboxes. A task runs in a new writable snapshot of a
 * subvolume, served through FUSE by a server that runs in the task's own
 * cgroup (so that the disk I/O done for the task is charged to it), in
 * fresh mount, PID, IPC, UTS and network namespaces, under a seccomp
 * filter, without new privileges and with a reduced capability set.
 *
 * Two shapes: a root sandbox has the snapshot as its root file system
 * (container-style); a workdir sandbox sees the host's file systems
 * read-only, with the snapshot mounted at a path of its choice as its
 * writable working tree (build-farm style).
 *
 * cgroups: what the host offers is applied, on cgroup v2 (io.max,
 * io.weight, io.latency, memory.max, pids.max, cpu.max) and on cgroup v1
 * (blkio.throttle.*, blkio.bfq.weight, memory, pids, cpu); what could not be
 * applied is reported, never silently dropped. A sandbox's cgroup is made
 * at BASE/cowbox/NAME in each hierarchy, BASE being the caller's own
 * cgroup, or on v2 the one delegated to it (runtime_cgroup_delegate()).
 *
 * Functions return 0 or a negative errno and never print.
 */

#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "store.h"

typedef enum SandboxShape {
        SANDBOX_ROOT,
        SANDBOX_WORKDIR,
} SandboxShape;

/* 0 means no limit. */
typedef struct SandboxLimits {
        uint64_t memory_max;            /* bytes */
        uint64_t pids_max;
        uint64_t cpu_percent;           /* of one CPU: 50 is half of one, 200 two */
        uint64_t io_read_bps;           /* on the device that holds the store */
        uint64_t io_write_bps;
        uint64_t io_read_iops;
        uint64_t io_write_iops;
        uint64_t io_weight;             /* 1..10000 (v2), 1..1000 (v1 bfq) */
        uint64_t io_latency_us;         /* v2 io.latency target */
} SandboxLimits;

typedef struct SandboxOptions {
        const char *source;             /* the subvolume to snapshot */
        bool in_source;                 /* run in source itself: no snapshot made or deleted */
        const char *name;               /* the snapshot's name; NULL: made up */
        SandboxShape shape;
        const char *workdir;            /* SANDBOX_WORKDIR: where the snapshot appears */
        char *const *argv;
        char *const *envp;              /* NULL: a minimal environment */
        const char *cwd;                /* NULL: the snapshot's root */
        uid_t uid;                      /* the task's user and group */
        gid_t gid;
        const char *hostname;           /* NULL: the snapshot's name */
        bool host_network;              /* else a network namespace with loopback only */

        /* A user namespace: the sandbox's IDs 0..userns_size-1 are the
         * host's userns_base.. (the snapshot's files appear as the
         * sandbox's root's). 0 for none. */
        uid_t userns_base;
        uint32_t userns_size;
        bool keep;                      /* keep the snapshot afterwards */
        /* How much the snapshot's files may grow (a quota of the image's
         * size and this), so that one task cannot fill the store's disk
         * for all; 0: no limit of its own. Not for in_source. */
        uint64_t disk_max;
        uint64_t timeout_usec;          /* 0: none */
        const char *stdout_path;        /* NULL: the caller's */
        const char *stderr_path;
        SandboxLimits limits;
        /* The v2 cgroup (as /proc/self/cgroup names it) to make the
         * sandbox's below, from runtime_cgroup_delegate(); NULL: the
         * caller's own. */
        const char *cgroup_base;

        /* Widening the confinement, by name: system calls the filter lets
         * through ("ptrace", "mount", ...), capabilities kept
         * ("CAP_SYS_PTRACE", ...). NULL-terminated, or NULL. */
        char *const *allow_syscalls;
        char *const *keep_capabilities;
        bool kill_on_refusal;           /* a refused call kills instead of EPERM */

        /* If set, watched while the task runs: once it is non-zero the task
         * is killed and the sandbox cleaned up (a signal handler sets it). */
        const volatile int *cancel;
        /* If set, watched too: a signal the caller got (a handler sets it),
         * passed on to the task and then reset to 0. The task may end,
         * and the sandbox is cleaned up as after any end. */
        volatile sig_atomic_t *forward_signal;
} SandboxOptions;

typedef struct SandboxResult {
        char *snapshot;                 /* its name (deleted unless kept) */
        int exit_status;                /* of the task: 0..255, or 128 + signal */
        int signal;                     /* the signal that ended it, or 0 */
        bool timed_out;
        bool cancelled;
        bool oom_killed;
        bool pids_limit_hit;
        uint64_t cpu_usec;
        uint64_t memory_peak;
        uint64_t io_read_bytes;
        uint64_t io_write_bytes;
        unsigned cgroup_version;        /* of the I/O controller used: 1 or 2, 0 for none */

        /* "io.latency: the host's cgroup v2 tree has no io controller" */
        char **not_applied;             /* NULL-terminated */
} SandboxResult;

void sandbox_result_clear(SandboxResult *r);

/* Moves the calling process into the cgroup NAME (made if missing) below
 * its own (on v2, below cgroup_base if not NULL), with the limits given
 * (I/O on the device of path): for background work such as the reaper, at
 * a low I/O weight. What the host could not apply is in *ret_not_applied
 * (NULL-terminated, or NULL). */
int runtime_enter_cgroup(const char *name, const char *cgroup_base, const SandboxLimits *limits, const char *path,
                         char ***ret_not_applied);

/* cgroup v2 only hands controllers down from a cgroup that holds no
 * process. Where the calling process's own v2 cgroup was delegated to it
 * (systemd's Delegate=yes marks it with the trusted.delegate or
 * user.delegate attribute), moves the process into a leaf below it,
 * RUNTIME_CGROUP_LEAF, and returns the delegated cgroup in *ret_base (as
 * /proc/self/cgroup names it) for SandboxOptions.cgroup_base. So too if
 * the process is in a leaf of its delegated cgroup already (systemd's
 * DelegateSubgroup=). *ret_base is NULL, and nothing is done, where
 * nothing was delegated or there is no v2 tree. Call it before making
 * other processes: only the caller moves. Returns 1 if it moved, 0 if
 * not, or a negative errno if it could not. */
#define RUNTIME_CGROUP_LEAF "supervisor"
int runtime_cgroup_delegate(char **ret_base);

/* Runs a task to its end. The snapshot is deleted and handed to a
 * background reaper unless opts->keep and the task was not cancelled.
 * Returns 0 once the task ran (its own failure is in the result), a
 * negative errno if the sandbox could not be made; error_text then says
 * what went wrong. */
int sandbox_run(Store *s, const SandboxOptions *opts, SandboxResult *ret, char *error_text, size_t error_size);

/* Limits how much the files of subvolume name may grow from what they
 * hold now: its quota becomes their size and bytes, unless it has a
 * smaller one already. */
int sandbox_limit_growth(Store *s, const char *name, uint64_t bytes);

/* Removes what the runs of dead runners left behind (killed with -9, or
 * before a reboot): their snapshots, cgroups, directories and mounts.
 * sandbox_run() calls it first. Returns the number of snapshots deleted
 * (for a reaper to free), or a negative errno. */
int sandbox_remove_stale(Store *s);

/* Whether name is a capability a task can keep (CAP_NET_ADMIN), and a
 * system call the sandbox refuses unless let through. */
bool sandbox_capability_known(const char *name);
bool sandbox_syscall_refused(const char *name);
