/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Internals of runtime/: cgroups (cgroup.c), confinement (confine.c) and
 * the sandbox itself (sandbox.c). */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "runtime.h"

/* The hierarchies a sandbox's cgroup lives in: the unified (v2) tree, and
 * the v1 hierarchies of the controllers it uses. Paths of the sandbox's
 * cgroup in each, "" where it has none. */
typedef enum CgroupController {
        CG_UNIFIED,
        CG_BLKIO,
        CG_MEMORY,
        CG_PIDS,
        CG_CPU,
        CG_CPUACCT,
        _CG_MAX,
} CgroupController;

/* The controllers a sandbox uses in the unified tree. */
typedef enum CgroupV2Controller {
        V2_IO,
        V2_MEMORY,
        V2_PIDS,
        V2_CPU,
        _V2_MAX,
} CgroupV2Controller;

typedef struct Cgroup {
        char *path[_CG_MAX];            /* the sandbox's directory in each hierarchy */
        bool v2_io, v2_memory, v2_pids, v2_cpu;
        unsigned io_version;
        char **not_applied;
        size_t n_not_applied;
        /* Why a controller the host's v2 tree has is not in the sandbox's
         * v2 cgroup (it could not be handed down); NULL where it is, or
         * where the host's v2 tree has none. */
        char *v2_why[_V2_MAX];
        bool v2_tree;           /* the host has a unified tree */
        bool v2_offered[_V2_MAX]; /* ... with the controller (its root's cgroup.controllers) */
        bool reuse;             /* set before cgroup_create: an existing cgroup is fine */
        const char *v2_base;    /* set before cgroup_create: SandboxOptions.cgroup_base */
        /* Set before cgroup_create: called with each cgroup's path before
         * it is made, to write it down; a failure stops the making. */
        int (*before_make)(const char *path, void *userdata);
        void *before_make_userdata;
} Cgroup;

int cgroup_create(Cgroup *cg, const char *name);
/* Applies the limits for I/O on the device dev (0: no device known). */
void cgroup_apply(Cgroup *cg, const SandboxLimits *limits, dev_t dev);
/* Moves pid into every hierarchy of the sandbox. */
int cgroup_attach(const Cgroup *cg, pid_t pid);
void cgroup_collect(const Cgroup *cg, dev_t dev, SandboxResult *ret);
/* Kills every process left and removes the cgroups. */
void cgroup_destroy(Cgroup *cg);
/* The same for one cgroup directory. */
void cgroup_remove_path(const char *path);

/* The whole disk under path (a partition's disk; for btrfs, the device it
 * was mounted from): the device I/O limits name. */
dev_t block_device_of(const char *path);

/* In the task, last thing before exec: capabilities, no_new_privs, the
 * seccomp filter. */
int confine_task(const SandboxOptions *opts);

/* The record of what a run made, removed last (leftovers.c). */
typedef struct RunRecord {
        int fd;
        char *path;
        bool name_synced;
} RunRecord;

/* Makes the record of the run of sandbox name, with this process as its
 * owner: -EEXIST if one of that name is there. */
int run_record_create(const char *sandboxes_dir, const char *name, RunRecord *ret);
/* Adds "key value": what the run made and must be removed if it dies. */
int run_record_add(RunRecord *rec, const char *key, const char *value);
/* Makes what was added so far durable, the record's name with it: before
 * what it names is made durable itself (a power loss may keep that and
 * lose unsynced lines of the record). */
int run_record_sync(RunRecord *rec);
/* At the end of the run; or only closed, when what it names is left for
 * the next run to remove. */
void run_record_remove(RunRecord *rec);
void run_record_close(RunRecord *rec);
