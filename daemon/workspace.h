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
/* A restore's new state, until it takes the workspace's place: '+' is in
 * no workspace's name and no label, so no workspace can own this name. */
#define WORKSPACE_RESTORING_SUFFIX "+restoring"

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
        int mount_error;        /* why the last mount was refused: -ELOOP
                                 * for an unsafe mount point; 0 if it was not */
        struct Workspace *next;
} Workspace;

typedef struct Workspaces {
        char *state_file;       /* the list, as JSON */
        char *default_base;     /* where workspaces are mounted unless told */
        Workspace *list;
} Workspaces;

/* A list that cannot be read is an error (-EUCLEAN for a damaged one),
 * with a sentence in *ret_error that names the file and the damage:
 * started without it, the daemon would forget the workspaces. */
int workspaces_load(Workspaces *w, const char *store_path, char **ret_error);
void workspaces_done(Workspaces *w);
int workspaces_save(const Workspaces *w);
Workspace *workspace_find(const Workspaces *w, const char *name);
/* The workspace whose own subvolume this is (also a restore's new state,
 * NAME+restoring), or also whose checkpoint. */
Workspace *workspace_find_by_subvolume(const Workspaces *w, const char *subvolume, bool or_checkpoint);
bool workspace_name_is_valid(const char *name);

/* The workspace's subvolume name ("workspace-NAME"), or its checkpoint's. */
int workspace_subvolume(const char *name, const char *label, char **ret);

/* Checks a mount point asked for new workspace NAME and resolves its
 * parent's symbolic links: it must be absolute, of plain components,
 * under an existing directory, an empty directory or nothing yet, no mount
 * point, neither inside nor around the store, its directories or another
 * workspace, and in the default directory of workspaces only NAME's own
 * default. -EINVAL with *ret_reason saying why otherwise. */
int workspace_check_path(const Workspaces *w, const char *store_path, const char *name, const char *path,
                         char **ret, const char **ret_reason);
bool workspace_path_is_taken(const Workspaces *w, const char *path);

/* Adds it to the list (saved), creates the subvolume, gives its root to
 * the owner and sets the limit; the caller mounts it, and calls
 * workspace_create_undo() if that fails. -EADDRINUSE if its mount point
 * is another workspace's, or lies in or around one. */
int workspace_create(Workspaces *w, Store *s, const char *name, const char *image,
                     uid_t owner, gid_t group, uint64_t limit, const char *path);
/* Takes a new workspace out of the list (saved) and deletes its subvolume. */
int workspace_create_undo(Workspaces *w, Store *s, const char *name);

/* A server that starts waits for a fold or a snapshot that holds its
 * subvolume for a moment, up to a minute: how long to wait for it to be
 * ready. Longer than that, so that a server that gives up says so first;
 * one that mounted after the daemon had given up would serve a workspace
 * whose creation was undone. */
#define WORKSPACE_MOUNT_TIMEOUT_USEC (90 * 1000 * 1000)

/* Starts the server of a workspace unless it is served already; a dead
 * mount (its server gone) is cleaned up first. *ret_ready_fd is then the
 * read end of a pipe that becomes readable once the server is ready or
 * failed (workspace_mount_ready() tells which), or -EBADF if it was served
 * already. -ELOOP if its mount point is no longer a directory of root or
 * its owner reached through directories only (a symbolic link swapped
 * in): nothing is mounted then. */
int workspace_mount_start(Workspace *ws, Store *s, const char *store_path, int *ret_ready_fd);
/* Once the pipe is readable: 0 if the server is ready, -EIO if it failed. */
int workspace_mount_ready(int fd);
/* Both, waiting up to WORKSPACE_MOUNT_TIMEOUT_USEC (then -ETIMEDOUT): for
 * callers that serve nothing else meanwhile. */
int workspace_mount(Workspace *ws, Store *s, const char *store_path);

/* After the unmount, the server makes its last commit and only then lets
 * go of the subvolume: with much written and not yet committed, that
 * takes seconds. How long to wait for it before giving up with -ETIME,
 * and how often to look. */
#define WORKSPACE_RELEASE_TIMEOUT_USEC (15 * 1000 * 1000)
#define WORKSPACE_RELEASE_POLL_USEC (50 * 1000)

/* Unmounts it without waiting for its server to let go; -EBUSY if its
 * subvolume is mounted elsewhere, or its files are in use. */
int workspace_unmount_start(const Workspace *ws, Store *s);
/* 1 once no server holds its subvolume (or it has none), 0 while one
 * does, or a negative errno. */
int workspace_released(const Workspace *ws, Store *s);
/* Waits in a sleep until released, or -ETIME at deadline_usec
 * (CLOCK_MONOTONIC): for callers that serve nothing else meanwhile. */
int workspace_wait_released(const Workspace *ws, Store *s, uint64_t deadline_usec);
/* Both: unmounts, and waits up to WORKSPACE_RELEASE_TIMEOUT_USEC. */
int workspace_unmount(const Workspace *ws, Store *s);
bool workspace_is_mounted(const Workspace *ws);

/* Whether a workspace is served, asked of the store's lock: the mount of a
 * dead server stays listed, and the kernel answers stat() of it from its
 * cache. */
typedef enum WorkspaceServer {
        WORKSPACE_SERVED,               /* mounted at its path, its server alive */
        WORKSPACE_HELD_ELSEWHERE,       /* not mounted there, its subvolume mounted by a live process */
        WORKSPACE_NOT_SERVED,           /* neither: unmounted, or its server died */
} WorkspaceServer;

WorkspaceServer workspace_server(const Workspace *ws, Store *s);

/* Removal and restore unmount the workspace in the middle. So that the
 * caller may answer others while the server lets go, each is in two
 * parts, and the caller unmounts in between (workspace_unmount_start(),
 * then workspace_released() or workspace_wait_released()). */

/* Once unmounted and released: deletes its subvolume and checkpoints, and
 * saves the list without it; it stays listed if that save fails. */
int workspace_remove_unmounted(Workspaces *w, Store *s, const char *name);
int workspace_set_limit(Workspaces *w, Store *s, const char *name, uint64_t limit);
int workspace_checkpoint(Workspaces *w, Store *s, const char *name, const char *label);
/* Makes the restored state from checkpoint label, beside the workspace's:
 * -ENOKEY if there is no such checkpoint. */
int workspace_restore_prepare(Workspaces *w, Store *s, const char *name, const char *label);
/* Given the unmount's result (0 once released, or a negative errno),
 * switches the workspace over to the restored state; if the unmount
 * failed, drops the restored state. Whatever it returns, the caller then
 * mounts the workspace again. */
int workspace_restore_finish(Workspaces *w, Store *s, const char *name, int unmounted);

/* NULL if it cannot be made: no memory, or a name that is not UTF-8. */
json_t *workspace_to_json(const Workspace *ws, Store *s);
int workspace_checkpoints_json(const Workspace *ws, Store *s, json_t **ret);
