/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Developer workspaces: a writable snapshot of an image per developer,
 * mounted at a path of its own, its root owned by the developer, under a
 * size limit. The daemon keeps their list in a JSON file next to its store
 * and mounts them again when it starts. Checkpoints are read-only
 * snapshots of a workspace; restoring one swaps the workspace for a
 * writable snapshot of it.
 */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "store.h"

/* The subvolume of workspace NAME, and of its checkpoint LABEL. */
#define WORKSPACE_PREFIX "workspace-"
#define WORKSPACE_CHECKPOINT_SEPARATOR "@"

/* The warning mark: a share of the limit, in percent. */
#define WORKSPACE_WARNING_PERCENT 90

typedef struct Workspace {
        char *name;
        char *image;
        char *path;
        uid_t owner;
        gid_t group;
        uint64_t limit;
        uint64_t created_usec;

        /* Known while the daemon runs. */
        bool warned;            /* past the warning mark, signalled */
        bool full;              /* at the limit, signalled */
        bool disk_full;         /* the disk under the store is full, signalled */
        struct Workspace *next;
} Workspace;

typedef struct Workspaces {
        char *state_file;       /* the list, as JSON */
        char *default_base;     /* where workspaces are mounted unless told */
        Workspace *list;
} Workspaces;

int workspaces_load(Workspaces *w, const char *store_path);
void workspaces_done(Workspaces *w);
int workspaces_save(const Workspaces *w);
Workspace *workspace_find(const Workspaces *w, const char *name);
bool workspace_name_is_valid(const char *name);

/* The workspace's subvolume name ("workspace-NAME"), or its checkpoint's. */
int workspace_subvolume(const char *name, const char *label, char **ret);

/* Creates the subvolume, gives its root to the owner, sets the limit,
 * mounts it and adds it to the list (saved). */
int workspace_create(Workspaces *w, Store *s, const char *store_path, const char *name, const char *image,
                     uid_t owner, gid_t group, uint64_t limit, const char *path);

/* Mounts a workspace unless it is mounted already; a dead mount (its
 * server gone) is cleaned up first. */
int workspace_mount(const Workspace *ws, const char *store_path);
int workspace_unmount(const Workspace *ws, Store *s);
bool workspace_is_mounted(const Workspace *ws);

int workspace_remove(Workspaces *w, Store *s, const char *name);
int workspace_set_limit(Workspaces *w, Store *s, const char *name, uint64_t limit);
int workspace_checkpoint(Workspaces *w, Store *s, const char *name, const char *label);
int workspace_restore(Workspaces *w, Store *s, const char *store_path, const char *name, const char *label);

json_t *workspace_to_json(const Workspace *ws, Store *s);
int workspace_checkpoints_json(const Workspace *ws, Store *s, json_t **ret);
