/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The daemon's model: the manager owns the store, the bus connection, the
 * event loop and the jobs. Its bus face is in manager-dbus.c,
 * subvolume-dbus.c and job-dbus.c; this file's types are the daemon's own.
 */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "store.h"
#include "workspace.h"

#define JOBS_MAX 64
/* Of 1..10000 (v2) or 1..1000 (v1): the foreground's default is 100. */
#define REAPER_IO_WEIGHT 10

typedef struct Manager Manager;
typedef struct Sandbox Sandbox;
typedef struct WorkspaceCall WorkspaceCall;

typedef enum JobType {
        JOB_RECEIVE,
        JOB_SEND,
        JOB_SCRUB,
        JOB_REAP,
        JOB_RUN,
        _JOB_TYPE_MAX,
} JobType;

typedef enum JobState {
        JOB_RUNNING,
        JOB_DONE,
        JOB_FAILED,
        JOB_CANCELLED,
} JobState;

/* Long work, done by a forked worker that reports over a pipe: lines of
 * "progress DONE TOTAL", then one "result JSON" or "error ERRNO TEXT". */
typedef struct Job {
        Manager *manager;
        uint32_t id;
        JobType type;
        char *target;           /* the image, or the store */
        JobState state;
        uint64_t bytes_done;
        uint64_t bytes_total;

        pid_t worker;
        int pipe_fd;
        sd_event_source *pipe_source;
        sd_event_source *child_source;
        sd_event_source *kill_timer;
        char *line;             /* the report's line being read */
        size_t line_len, line_size;
        bool line_dropped;      /* an overlong line: skipped to its end */

        int error;              /* of a failed job, negative errno */
        char *error_text;
        char *result;           /* JSON text of a job done */
        uint64_t progress_usec; /* last PropertiesChanged */
        sd_bus_slot *owner_watch; /* the caller leaving the bus cancels it */

        struct Job *next;
} Job;

struct Manager {
        char *store_path;
        Store *store;
        sd_event *event;
        sd_bus *bus;
        Job *jobs;
        unsigned n_jobs;
        uint32_t next_job_id;
        Workspaces workspaces;
        /* Removals and restores waiting for a server's last commit,
         * and mounts waiting for their server to be ready. */
        WorkspaceCall *workspace_calls;
        Sandbox *sandboxes;

        /* Free space of the disk, in percent: below the low mark the
         * reaper works at full speed until the high mark is reached. */
        unsigned low_mark, high_mark;
        bool urgent;
        /* A reap found the reaper paused: its work waits for the resume,
         * which 'cowbox-store reap --resume' makes without telling us. */
        bool reap_deferred;

        /* Ticks of the space watch that look again for what receives of a
         * daemon that died left: its workers may outlive it for a moment. */
        unsigned recover_ticks;

        /* The v2 cgroup delegated to the daemon, below which sandboxes'
         * cgroups are made (the daemon is in a leaf of it); NULL: none. */
        char *cgroup_base;

        /* The last subvolume whose properties were read, and in which turn
         * of the event loop: a GetAll, or an object manager's listing,
         * reads every property of an object in one turn, each on its own. */
        StoreSubvolumeInfo subvolume_cache;
        uint64_t subvolume_cache_iteration;
        bool subvolume_cache_valid;
};

int manager_new(const char *store_path, Manager **ret);
Manager *manager_free(Manager *m);
/* On failure, *ret_error may say what failed in a sentence (the caller
 * frees it). */
int manager_start(Manager *m, char **ret_error);
int manager_run(Manager *m);

/* Recovery at start and after a worker died: removes half-received images
 * and lets the reaper free what they and deleted subvolumes hold. */
void manager_recover(Manager *m);
void manager_reap_soon(Manager *m);
int manager_start_reap(Manager *m, Job **ret);

/* Checks a subvolume's name as the API takes it: a store's name, not one of
 * a receive's temporary ones. Sets an InvalidName error otherwise. */
int manager_check_name(const char *name, sd_bus_error *error);
/* The same for a name to be made: not one of those that workspaces and
 * sandboxes make for themselves (a checkpoint, a sandbox's snapshot),
 * which their own methods make. */
int manager_check_new_name(const char *name, sd_bus_error *error);

/* The prefix of the names of sandboxes' snapshots. */
#define SANDBOX_PREFIX "sbx-"

/* Checks that the caller may change things: root, or a member of the
 * cowbox group. Sets an AccessDenied error otherwise. */
int manager_check_caller(sd_bus_message *message, sd_bus_error *error);
/* The caller's effective UID, and whether it may change things. */
int manager_caller_identity(sd_bus_message *message, uid_t *ret_uid, bool *ret_may_change);

/* Work shared by the manager's methods and the subvolume objects'. */
int manager_snapshot(sd_bus_message *message, Manager *m, const char *source, const char *name,
                     const char *options, sd_bus_error *error);
int manager_delete(sd_bus_message *message, Manager *m, const char *name, bool image_only, sd_bus_error *error);

/* A store error as the caller should read it: a name and a sentence. */
int store_error_reply(int r, const char *name, sd_bus_error *error);

/* Signals. */
/* What is known of a subvolume, read once per turn of the event loop;
 * valid until the next call. */
int manager_subvolume_info(Manager *m, const char *name, const StoreSubvolumeInfo **ret);
void manager_subvolume_cache_drop(Manager *m);
int manager_signal_subvolume(Manager *m, const char *name, bool added);

/* Jobs (job.c). work runs in the forked worker, with the store opened
 * anew; it returns the result JSON (or NULL) and sets *ret_error. */
typedef json_t *(*job_work_t)(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                              void (*progress)(uint64_t done, uint64_t total));

int job_start(Manager *m, JobType type, const char *target, job_work_t work, void *userdata,
              void (*userdata_free)(void *), Job **ret);
int job_cancel(Job *j);
/* Cancels the job when the bus client sender (a unique name) goes away. */
int job_watch_owner(Job *j, const char *sender);
Job *manager_find_job(Manager *m, uint32_t id);
const char *job_type_to_string(JobType t);
const char *job_state_to_string(JobState s);
json_t *job_to_json(const Job *j);
void manager_job_finished(Manager *m, Job *j);

/* Workspaces (workspace-dbus.c): loads the list, mounts them, and watches
 * their use against their limits. */
int manager_start_workspaces(Manager *m, char **ret_error);
/* When the daemon stops: finishes and answers the removals, restores and
 * creations still waiting for a server to let go or to be ready, waiting
 * for it here. */
void manager_stop_workspaces(Manager *m);
int method_create_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_list_workspaces(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_get_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_remove_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_set_workspace_limit(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_checkpoint_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_restore_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_list_checkpoints(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* A subvolume of a workspace, or a checkpoint of one, is for its owner, root
 * and the cowbox group to read: AccessDenied for anyone else. */
int manager_check_workspace_reader(sd_bus_message *message, Manager *m, const char *subvolume,
                                   sd_bus_error *error);

/* Replies the job that r and j say was started, or the error. */
int reply_job(sd_bus_message *message, Manager *m, int r, Job *j, sd_bus_error *error);

/* Tasks in sandboxes (task-dbus.c): checks a command and its options,
 * and starts a job that runs it in a new snapshot of source, or in source
 * itself. */
int task_check(const char *source, char **argv, const char *options, json_t **ret_opts, sd_bus_error *error);
int task_start(Manager *m, const char *source, char *const *argv, json_t *opts, bool in_source, Job **ret);
int method_run_task(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* Removes the files of tasks' output whose workers were killed. */
void task_remove_stale_outputs(const char *store_path);

/* Sandboxes with a life of their own (sandbox-dbus.c). */
/* As workspaces_load: a list that cannot be read is an error with a
 * sentence, never replaced by an empty one. */
int manager_load_sandboxes(Manager *m, char **ret_error);
void manager_free_sandboxes(Manager *m);
void manager_sandbox_job_finished(Manager *m, Job *j);
/* Whether subvolume is a sandbox's own snapshot. */
bool manager_sandbox_owns(Manager *m, const char *subvolume);
int method_create_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_start_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_wait_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_kill_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_delete_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error);
int method_list_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error);

/* Bus faces. */
extern const sd_bus_vtable manager_vtable[];
extern const sd_bus_vtable subvolume_vtable[];
extern const sd_bus_vtable job_vtable[];
extern const sd_bus_vtable sandbox_vtable[];
int sandbox_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                        void **found, sd_bus_error *error);
int sandbox_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);
int subvolume_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                          void **found, sd_bus_error *error);
int subvolume_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);
int job_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                    void **found, sd_bus_error *error);
int job_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);
int job_send_changed(Job *j);
int job_send_new(Job *j);
int job_send_removed(Job *j);
