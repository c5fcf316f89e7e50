/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The workspace methods of org.cowbox1.Manager, and the watch that warns
 * before a workspace reaches its limit. */

#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "api.h"
#include "cleanup.h"
#include "fd-util.h"
#include "manager.h"
#include "string-util.h"
#include "time-util.h"
#include "workspace.h"

#define _cleanup_json_ _cleanup_(json_decrefp)
#define WATCH_INTERVAL_USEC (2 * 1000 * 1000)

static int workspace_error(int r, const char *name, sd_bus_error *error) {
        switch (r) {
        case -ENOENT:
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_WORKSPACE, "There is no workspace named '%s'; "
                                         "ListWorkspaces names them.", name);
        case -ENOKEY:
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_CHECKPOINT, "Workspace '%s' has no such "
                                         "checkpoint; ListCheckpoints names them.", name);
        case -EEXIST:
                return sd_bus_error_setf(error, API_ERROR_NAME_TAKEN, "'%s' exists already; choose another name.",
                                         name);
        case -EBUSY:
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Workspace '%s' is in use: close the programs "
                                         "that have files open in it (or unmount its subvolume where "
                                         "else it is mounted), then try again.", name);
        case -ETIME:
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Workspace '%s' was unmounted, but its server "
                                         "had not let go of it after %u s: it may still be committing what "
                                         "was written to it. Try again in a moment.", name,
                                         (unsigned) (WORKSPACE_RELEASE_TIMEOUT_USEC / 1000000));
        case -ETIMEDOUT:
                return sd_bus_error_setf(error, API_ERROR_BUSY, "The server of workspace '%s' was not ready "
                                         "after %u s: another process (a fold, a snapshot) may hold its "
                                         "subvolume. Try again in a moment.", name,
                                         (unsigned) (WORKSPACE_MOUNT_TIMEOUT_USEC / 1000000));
        case -EINVAL:
                return sd_bus_error_setf(error, API_ERROR_INVALID_NAME, "'%s' is not a valid name: up to 64 "
                                         "letters, digits, '.', '_' and '-', not starting with '.' or '-'.", name);
        default:
                return r;
        }
}

/* SubvolumeNew or SubvolumeRemoved of a workspace's subvolume, or of one
 * of its checkpoints. */
static void signal_subvolume(Manager *m, const char *name, const char *label, bool added) {
        _cleanup_free_ char *subvolume = NULL;

        if (workspace_subvolume(name, label, &subvolume) >= 0)
                (void) manager_signal_subvolume(m, subvolume, added);
}

/* A mount refused: the workspace stays unmounted until its mount point is
 * safe again, when the watch mounts it. */
static int unsafe_mount_point_error(const Workspace *ws, sd_bus_error *error) {
        return sd_bus_error_setf(error, API_ERROR_UNSAFE_MOUNT_POINT, "Workspace '%s' is not mounted: %s must be "
                                 "a directory of root or of its owner, with no symbolic link on its way. Make it "
                                 "one again; the workspace is mounted there within seconds.", ws->name, ws->path);
}

static Workspace *find(Manager *m, const char *name, sd_bus_error *error) {
        Workspace *ws = workspace_name_is_valid(name) ? workspace_find(&m->workspaces, name) : NULL;

        if (!ws)
                (void) workspace_error(workspace_name_is_valid(name) ? -ENOENT : -EINVAL, name, error);
        return ws;
}

/* A removal or a restore between the unmount and the moment its server,
 * after its last commit, lets go of the subvolume: that can take seconds,
 * in which the daemon answers other calls. So does a mount between the
 * start of its server and the moment it is ready, which may wait for
 * another process to let go of the subvolume (a fold, a snapshot): a
 * creation's, a restore's last step, or the watch's. Its own call is
 * answered once the removal, the restore or the mount is done. */
typedef enum CallType {
        CALL_REMOVE,
        CALL_RESTORE,
        CALL_CREATE,
        CALL_SERVE,                     /* the watch's mount: nobody to answer */
} CallType;

struct WorkspaceCall {
        Manager *manager;
        sd_bus_message *message;        /* NULL for CALL_SERVE */
        CallType type;
        char *name;
        char *label;                    /* a restore's checkpoint */
        json_t *checkpoints;            /* a removal's, for its signals */
        bool had_subvolume;             /* a removal's */
        int switched;                   /* a restore's switch, answered rather than its mount's result */
        int ready_fd;                   /* while its server starts */
        sd_event_source *ready;
        sd_event_source *timer;
        uint64_t deadline_usec;         /* CLOCK_MONOTONIC */
        WorkspaceCall *after;           /* CALL_SERVE's: a removal or a restore asked for meanwhile */
        WorkspaceCall *next;
};

static void call_mount(WorkspaceCall *c);
static void call_begin(Manager *m, WorkspaceCall *c);

static WorkspaceCall *call_free(WorkspaceCall *c) {
        if (!c)
                return NULL;
        if (c->manager)
                for (WorkspaceCall **p = &c->manager->workspace_calls; *p; p = &(*p)->next)
                        if (*p == c) {
                                *p = c->next;
                                break;
                        }
        sd_bus_message_unref(c->message);
        sd_event_source_disable_unref(c->ready);
        sd_event_source_disable_unref(c->timer);
        safe_close(c->ready_fd);
        free(c->name);
        free(c->label);
        json_decref(c->checkpoints);
        call_free(c->after);
        free(c);
        return NULL;
}

static void call_freep(WorkspaceCall **c) {
        call_free(*c);
}

static WorkspaceCall *call_new(sd_bus_message *message, CallType type, const char *name, const char *label) {
        _cleanup_(call_freep) WorkspaceCall *c = calloc(1, sizeof *c);

        if (!c)
                return NULL;
        c->ready_fd = -EBADF;
        c->message = sd_bus_message_ref(message);
        c->type = type;
        c->name = strdup(name);
        c->label = label ? strdup(label) : NULL;
        if (!c->name || (label && !c->label))
                return NULL;
        return TAKE_PTR(c);
}

/* Listed from now on: other changes of its workspace are refused. */
static void call_add(Manager *m, WorkspaceCall *c) {
        c->manager = m;
        c->next = m->workspace_calls;
        m->workspace_calls = c;
}

static WorkspaceCall *pending_call(Manager *m, const char *name) {
        for (WorkspaceCall *c = m->workspace_calls; c; c = c->next)
                if (streq(c->name, name))
                        return c;
        return NULL;
}

/* Nothing else may change a workspace that is being switched over,
 * removed or mounted, and a second removal or restore would unmount it
 * again. A removal or a restore may follow the watch's mount, which
 * nobody asked for: if ret_serving is given, that mount is returned,
 * for the call to wait for. */
static int check_not_pending(Manager *m, const char *name, WorkspaceCall **ret_serving, sd_bus_error *error) {
        static const char *const doing[] = {
                [CALL_REMOVE] = "removed",
                [CALL_RESTORE] = "restored from a checkpoint",
                [CALL_CREATE] = "created",
                [CALL_SERVE] = "mounted",
        };
        WorkspaceCall *c = pending_call(m, name);

        if (ret_serving)
                *ret_serving = NULL;
        if (!c)
                return 0;
        if (ret_serving && c->type == CALL_SERVE && !c->after) {
                *ret_serving = c;
                return 0;
        }
        return sd_bus_error_setf(error, API_ERROR_BUSY, "Workspace '%s' is being %s; try again once that is "
                                 "done.", name, doing[c->after ? c->after->type : c->type]);
}

/* The owner may use their own workspace; root and the group any. */
static int check_owner_or_admin(sd_bus_message *message, const Workspace *ws, sd_bus_error *error) {
        _cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
        uid_t uid;

        if (sd_bus_query_sender_creds(message, SD_BUS_CREDS_EUID | SD_BUS_CREDS_AUGMENT, &creds) >= 0 &&
            sd_bus_creds_get_euid(creds, &uid) >= 0 && uid == ws->owner)
                return 0;
        return manager_check_caller(message, error);
}

int manager_check_workspace_reader(sd_bus_message *message, Manager *m, const char *subvolume,
                                   sd_bus_error *error) {
        const Workspace *ws = workspace_find_by_subvolume(&m->workspaces, subvolume, true);

        return ws ? check_owner_or_admin(message, ws, error) : 0;
}

static int parse_owner(const char *text, uid_t *ret_uid, gid_t *ret_gid) {
        struct passwd *pw;
        char *end = NULL;
        unsigned long v;

        if (!text) {
                *ret_uid = 0;
                *ret_gid = 0;
                return 0;
        }
        errno = 0;
        v = strtoul(text, &end, 10);
        if (end && *end == 0 && *text && (errno != 0 || v >= (uid_t) -1))
                return -ESRCH;  /* no uid_t holds it */
        pw = end && *end == 0 && *text ? getpwuid((uid_t) v) : getpwnam(text);
        if (!pw)
                return -ESRCH;
        *ret_uid = pw->pw_uid;
        *ret_gid = pw->pw_gid;
        return 0;
}

int method_create_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        static const ApiOption allowed[] = {
                { "image", 's' }, { "owner", 's' }, { "limit", 'u' }, { "path", 's' }, {}
        };
        _cleanup_(call_freep) WorkspaceCall *c = NULL;
        _cleanup_json_ json_t *opts = NULL;
        _cleanup_free_ char *resolved = NULL;
        Manager *m = userdata;
        const char *name, *options, *image, *path;
        uid_t uid;
        gid_t gid;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &options);
        if (r < 0)
                return r;
        if (!workspace_name_is_valid(name))
                return workspace_error(-EINVAL, name, error);
        r = api_parse_options(options, allowed, &opts, error);
        if (r < 0)
                return r;
        image = api_option_string(opts, "image", NULL);
        path = api_option_string(opts, "path", NULL);
        if (!image || !store_name_is_valid(image))
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Name the image with the option "
                                         "\"image\", e.g. {\"image\": \"src-main\"}.");
        if (api_option_uint(opts, "limit", 0) > (uint64_t) INT64_MAX)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"limit\" is too large.");
        if (parse_owner(api_option_string(opts, "owner", NULL), &uid, &gid) < 0)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "No user '%s' on this host.",
                                         api_option_string(opts, "owner", ""));
        r = manager_check_caller(message, error);
        if (r >= 0)
                r = check_not_pending(m, name, NULL, error);
        if (r < 0)
                return r;
        if (path) {
                const char *reason = NULL;

                r = workspace_check_path(&m->workspaces, m->store_path, name, path, &resolved, &reason);
                if (r == -EINVAL)
                        return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"path\" %s.", reason);
                if (r < 0)
                        return r;
        }

        c = call_new(message, CALL_CREATE, name, NULL);
        if (!c)
                return -ENOMEM;
        r = workspace_create(&m->workspaces, m->store, name, image, uid, gid, api_option_uint(opts, "limit", 0),
                             resolved);
        if (r == -EADDRINUSE)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Workspace '%s' would be mounted where "
                                         "another workspace is, or in or around one; give it another "
                                         "\"path\".", name);
        if (r == -EROFS)
                return sd_bus_error_setf(error, API_ERROR_NOT_READ_ONLY, "'%s' is not a read-only image.", image);
        if (r == -ENOENT)
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_IMAGE, "There is no image named '%s'.", image);
        if (r < 0)
                return workspace_error(r, name, error);
        call_add(m, c);
        call_mount(TAKE_PTR(c));
        return 1;
}

int method_list_workspaces(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *array = json_array();
        Manager *m = userdata;

        if (!array)
                return -ENOMEM;
        for (Workspace *ws = m->workspaces.list; ws; ws = ws->next)
                if (json_array_append_new(array, workspace_to_json(ws, m->store)) < 0)
                        return -ENOMEM;
        return api_reply_json(message, array);
}

int method_get_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *doc = NULL;
        Manager *m = userdata;
        const char *name;
        Workspace *ws;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        ws = find(m, name, error);
        if (!ws)
                return -EINVAL;
        doc = workspace_to_json(ws, m->store);
        if (!doc)
                return -ENOMEM;
        return api_reply_json(message, doc);
}

/* The rest of a removal, given the unmount's result (0 once released);
 * the answer, or an error for the caller to send. */
static int finish_remove(Manager *m, WorkspaceCall *c, int unmounted, sd_bus_error *error) {
        size_t i;
        json_t *v;
        int r = unmounted;

        if (r >= 0)
                r = workspace_remove_unmounted(&m->workspaces, m->store, c->name);
        if (r < 0)
                return workspace_error(r, c->name, error);
        if (c->had_subvolume)
                signal_subvolume(m, c->name, NULL, false);
        json_array_foreach(c->checkpoints, i, v)
                signal_subvolume(m, c->name, json_string_value(json_object_get(v, "label")), false);
        manager_reap_soon(m);
        return sd_bus_reply_method_return(c->message, NULL);
}

/* A mount's failure, as an error for the caller to send. */
static int mount_error(const WorkspaceCall *c, int r, sd_bus_error *error) {
        if (r == -ELOOP && c->type == CALL_CREATE)
                return sd_bus_error_setf(error, API_ERROR_UNSAFE_MOUNT_POINT, "The mount point of workspace '%s' "
                                         "must be a directory of root or of its owner, with no symbolic link "
                                         "on its way; nothing was made.", c->name);
        if (r == -ELOOP) {
                const Workspace *ws = workspace_find(&c->manager->workspaces, c->name);

                if (ws)
                        return unsafe_mount_point_error(ws, error);
        }
        return workspace_error(r, c->name, error);
}

/* The rest of a creation, given the mount's result: the answer, or an
 * error for the caller to send. */
static int finish_create(Manager *m, WorkspaceCall *c, int mounted, sd_bus_error *error) {
        _cleanup_json_ json_t *doc = NULL;

        if (mounted < 0) {
                (void) workspace_create_undo(&m->workspaces, m->store, c->name);
                return mount_error(c, mounted, error);
        }
        signal_subvolume(m, c->name, NULL, true);
        doc = workspace_to_json(workspace_find(&m->workspaces, c->name), m->store);
        if (!doc)
                return -ENOMEM;
        return api_reply_json(c->message, doc);
}

/* Answers the call if it failed (unless the caller left the bus
 * meanwhile: nobody to tell) and frees it. */
static void call_done(WorkspaceCall *c, int r, sd_bus_error *error) {
        if (r < 0 && c->message)
                (void) (sd_bus_error_is_set(error) ? sd_bus_reply_method_error(c->message, error)
                                                   : sd_bus_reply_method_errno(c->message, -r, NULL));
        call_free(c);
}

/* Finishes the call once its workspace's server is ready, or failed;
 * then begins the removal or restore that waited for it. */
static void call_mounted(WorkspaceCall *c, int mounted) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        WorkspaceCall *after = TAKE_PTR(c->after);
        Manager *m = c->manager;
        int r = 0;

        switch (c->type) {
        case CALL_CREATE:
                r = finish_create(m, c, mounted, &error);
                break;
        case CALL_RESTORE:
                r = c->switched < 0 ? workspace_error(c->switched, c->name, &error) :
                    mounted < 0 ? mount_error(c, mounted, &error) :
                    sd_bus_reply_method_return(c->message, NULL);
                break;
        default:
                break;
        }
        call_done(c, r, &error);
        if (after)
                call_begin(m, after);
}

/* Waits here for the server of a started mount, until the call's
 * deadline. */
static int call_wait_ready(WorkspaceCall *c) {
        uint64_t now = monotonic_usec();
        int r;

        r = fd_wait_readable(c->ready_fd, now < c->deadline_usec ? (int) ((c->deadline_usec - now) / 1000) : 0);
        if (r <= 0)
                return r == 0 ? -ETIMEDOUT : r;
        return workspace_mount_ready(c->ready_fd);
}

static int on_ready(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        call_mounted(userdata, workspace_mount_ready(fd));
        return 0;
}

static int on_ready_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        call_mounted(userdata, -ETIMEDOUT);
        return 0;
}

/* Starts the server of the call's workspace; finishes the call now if
 * that failed or it is served already, and otherwise once the server is
 * ready, or failed, or at the deadline with -ETIMEDOUT. Takes c, listed. */
static void call_mount(WorkspaceCall *c) {
        Manager *m = c->manager;
        Workspace *ws = workspace_find(&m->workspaces, c->name);
        int r;

        c->timer = sd_event_source_disable_unref(c->timer);
        r = ws ? workspace_mount_start(ws, m->store, m->store_path, &c->ready_fd) : -ENOENT;
        if (r < 0 || c->ready_fd < 0) {
                call_mounted(c, r);
                return;
        }
        c->deadline_usec = monotonic_usec() + WORKSPACE_MOUNT_TIMEOUT_USEC;
        r = sd_event_add_io(m->event, &c->ready, c->ready_fd, EPOLLIN, on_ready, c);
        if (r >= 0)
                r = sd_event_add_time(m->event, &c->timer, CLOCK_MONOTONIC, c->deadline_usec, 0, on_ready_timeout, c);
        if (r < 0) {
                /* The server is on its way: its answer is the call's. */
                c->ready = sd_event_source_disable_unref(c->ready);
                c->timer = sd_event_source_disable_unref(c->timer);
                call_mounted(c, call_wait_ready(c));
        }
}

/* The restore's switch, given the unmount's result; then its mount. */
static void finish_restore(Manager *m, WorkspaceCall *c, int unmounted) {
        c->switched = workspace_restore_finish(&m->workspaces, m->store, c->name, unmounted);
        /* The replaced state was deleted, whether or not the mount after
         * it succeeds: its space is the reaper's to give back, and the
         * workspace's subvolume is another one (another UUID) of the same
         * name. */
        if (c->switched >= 0) {
                signal_subvolume(m, c->name, NULL, false);
                signal_subvolume(m, c->name, NULL, true);
                manager_reap_soon(m);
        }
        call_mount(c);
}

/* Finishes the removal and answers it, or goes on with the restore,
 * once the server let go, or failed to. */
static void call_released(WorkspaceCall *c, int unmounted) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        if (c->type == CALL_RESTORE) {
                finish_restore(c->manager, c, unmounted);
                return;
        }
        r = finish_remove(c->manager, c, unmounted, &error);
        call_done(c, r, &error);
}

static int on_release_check(sd_event_source *s, uint64_t usec, void *userdata) {
        WorkspaceCall *c = userdata;
        Workspace *ws = workspace_find(&c->manager->workspaces, c->name);
        int r;

        r = ws ? workspace_released(ws, c->manager->store) : 1;
        if (r == 0 && monotonic_usec() < c->deadline_usec) {
                r = sd_event_source_set_time_relative(s, WORKSPACE_RELEASE_POLL_USEC);
                if (r >= 0)
                        r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
                if (r >= 0)
                        return 0;
        }
        call_released(c, r > 0 ? 0 : r == 0 ? -ETIME : r);
        return 0;
}

/* Given the result of workspace_unmount_start(): goes on now if that
 * failed or the server let go already, and otherwise once it has, or at
 * the deadline with -ETIME. Takes c; its call is answered. */
static int call_wait_released(Manager *m, WorkspaceCall *c, int unmounted) {
        Workspace *ws = workspace_find(&m->workspaces, c->name);
        int r = unmounted;

        call_add(m, c);
        if (r >= 0)
                r = ws ? workspace_released(ws, m->store) : 1;
        if (r == 0) {
                c->deadline_usec = monotonic_usec() + WORKSPACE_RELEASE_TIMEOUT_USEC;
                r = sd_event_add_time_relative(m->event, &c->timer, CLOCK_MONOTONIC, WORKSPACE_RELEASE_POLL_USEC,
                                               0, on_release_check, c);
                if (r >= 0)
                        return 1;
        }
        call_released(c, r > 0 ? 0 : r);
        return 1;
}

void manager_stop_workspaces(Manager *m) {
        /* Nothing else is served now: wait here, as long as they would
         * have waited, rather than leave them half done. A restore goes
         * on to its mount, and stays listed until that is done too. */
        while (m->workspace_calls) {
                WorkspaceCall *c = m->workspace_calls;
                Workspace *ws = workspace_find(&m->workspaces, c->name);

                c->ready = sd_event_source_disable_unref(c->ready);
                c->timer = sd_event_source_disable_unref(c->timer);
                if (c->type == CALL_SERVE && !c->after)
                        /* Nobody waits for it: the server comes up on its own. */
                        call_free(c);
                else if (c->ready_fd >= 0)
                        /* A serve's, when a removal or a restore waits for
                         * it, begins that one once its server is ready. */
                        call_mounted(c, call_wait_ready(c));
                else
                        call_released(c, ws ? workspace_wait_released(ws, m->store, c->deadline_usec) : 0);
        }
}

/* A removal's first step: what its signals will need, then the unmount. */
static int remove_begin(Manager *m, Workspace *ws, WorkspaceCall *c) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};

        /* Its checkpoints go with it: their names for the signals. */
        if (workspace_checkpoints_json(ws, m->store, &c->checkpoints) < 0)
                c->checkpoints = NULL;
        /* One listed by a daemon that died before it made the subvolume:
         * no signal announced that, and none says it went. */
        c->had_subvolume = workspace_subvolume(ws->name, NULL, &subvolume) >= 0 &&
                           store_subvolume_show(m->store, subvolume, &info) >= 0;
        store_subvolume_info_clear(&info);
        return workspace_unmount_start(ws, m->store);
}

/* Unmounts the workspace of a removal or a restore, and goes on once its
 * server let go. Takes c; its call is answered. */
static void call_begin(Manager *m, WorkspaceCall *c) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        Workspace *ws = find(m, c->name, &error);
        int r;

        if (!ws) {
                call_done(c, -ENOENT, &error);
                return;
        }
        if (c->type == CALL_RESTORE) {
                r = workspace_restore_prepare(&m->workspaces, m->store, c->name, c->label);
                if (r < 0) {
                        call_done(c, workspace_error(r, c->name, &error), &error);
                        return;
                }
                r = workspace_unmount_start(ws, m->store);
        } else
                r = remove_begin(m, ws, c);
        (void) call_wait_released(m, c, r);
}

/* Begins the call now, or once the watch's mount of its workspace is
 * done. Takes c. */
static int call_begin_after(Manager *m, WorkspaceCall *c, WorkspaceCall *serving) {
        if (serving)
                serving->after = c;
        else
                call_begin(m, c);
        return 1;
}

int method_remove_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        WorkspaceCall *c, *serving;
        Manager *m = userdata;
        const char *name;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        if (!find(m, name, error))
                return -EINVAL;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = check_not_pending(m, name, &serving, error);
        if (r < 0)
                return r;
        c = call_new(message, CALL_REMOVE, name, NULL);
        if (!c)
                return -ENOMEM;
        return call_begin_after(m, c, serving);
}

int method_set_workspace_limit(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name;
        uint64_t bytes;
        int r;

        r = sd_bus_message_read(message, "st", &name, &bytes);
        if (r < 0)
                return r;
        if (!find(m, name, error))
                return -EINVAL;
        if (bytes > (uint64_t) INT64_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "That limit is too large; 0 means none.");
        r = manager_check_caller(message, error);
        if (r >= 0)
                r = check_not_pending(m, name, NULL, error);
        if (r < 0)
                return r;
        r = workspace_set_limit(&m->workspaces, m->store, name, bytes);
        return r < 0 ? workspace_error(r, name, error) : sd_bus_reply_method_return(message, NULL);
}

int method_checkpoint_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name, *label;
        Workspace *ws;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &label);
        if (r < 0)
                return r;
        ws = find(m, name, error);
        if (!ws)
                return -EINVAL;
        if (!workspace_name_is_valid(label))
                return workspace_error(-EINVAL, label, error);
        r = check_owner_or_admin(message, ws, error);
        if (r >= 0)
                r = check_not_pending(m, name, NULL, error);
        if (r < 0)
                return r;
        r = workspace_checkpoint(&m->workspaces, m->store, name, label);
        if (r < 0)
                return workspace_error(r, r == -EEXIST ? label : name, error);
        signal_subvolume(m, name, label, true);
        return sd_bus_reply_method_return(message, NULL);
}

int method_restore_workspace(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *checkpoint = NULL;
        WorkspaceCall *c, *serving;
        Manager *m = userdata;
        const char *name, *label;
        Workspace *ws;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &label);
        if (r < 0)
                return r;
        ws = find(m, name, error);
        if (!ws)
                return -EINVAL;
        if (!workspace_name_is_valid(label))
                return workspace_error(-EINVAL, label, error);
        r = check_owner_or_admin(message, ws, error);
        if (r < 0)
                return r;
        r = check_not_pending(m, name, &serving, error);
        if (r < 0)
                return r;
        /* Said now, not after a wait for the watch's mount. */
        r = workspace_subvolume(name, label, &checkpoint);
        if (r >= 0)
                r = store_subvolume_exists(m->store, checkpoint);
        if (r <= 0)
                return workspace_error(r < 0 ? r : -ENOKEY, name, error);
        c = call_new(message, CALL_RESTORE, name, label);
        if (!c)
                return -ENOMEM;
        return call_begin_after(m, c, serving);
}

int method_list_checkpoints(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *array = NULL;
        Manager *m = userdata;
        const char *name;
        Workspace *ws;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        ws = find(m, name, error);
        if (!ws)
                return -EINVAL;
        r = workspace_checkpoints_json(ws, m->store, &array);
        return r < 0 ? r : api_reply_json(message, array);
}

/* ---- the watch ---- */

static void serve(Manager *m, const Workspace *ws) {
        WorkspaceCall *c = call_new(NULL, CALL_SERVE, ws->name, NULL);

        if (!c)
                return;
        call_add(m, c);
        call_mount(c);
}

static void watch_one(Manager *m, Workspace *ws, bool disk_full, uint64_t disk_free) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};
        uint64_t used;

        /* Its server died: serve it again. Not while its subvolume is
         * mounted elsewhere: that mount would fail, after a wait; nor
         * while a removal or a restore has it unmounted, nor while a
         * server of it starts. */
        if (!pending_call(m, ws->name) && workspace_server(ws, m->store) == WORKSPACE_NOT_SERVED)
                serve(m, ws);
        /* A full disk stops every workspace's writers: each is told. */
        if (disk_full && !ws->disk_full)
                (void) sd_bus_emit_signal(m->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE, "WorkspaceDiskFull",
                                          "st", ws->name, disk_free);
        ws->disk_full = disk_full;
        if (ws->limit == 0 || workspace_subvolume(ws->name, NULL, &subvolume) < 0 ||
            store_subvolume_show(m->store, subvolume, &info) < 0)
                return;
        used = info.logical_bytes;
        store_subvolume_info_clear(&info);

        if ((unsigned __int128) used * 100 >= (unsigned __int128) ws->limit * WORKSPACE_WARNING_PERCENT) {
                if (!ws->warned)
                        (void) sd_bus_emit_signal(m->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE, "WorkspaceWarning",
                                                  "stt", ws->name, used, ws->limit);
                ws->warned = true;
        } else
                ws->warned = false;
        /* Within a block of the limit is full: the next write fails. */
        if (used + 65536 >= ws->limit) {
                if (!ws->full)
                        (void) sd_bus_emit_signal(m->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE, "WorkspaceFull",
                                                  "stt", ws->name, used, ws->limit);
                ws->full = true;
        } else
                ws->full = false;
}

static int on_watch(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        int r;

        StoreSpace u = {};
        bool disk_full = false;

        if (m->workspaces.list && store_space(m->store, &u) >= 0)
                disk_full = u.fs_free_bytes <= u.fs_reserved_bytes + (1u << 20);
        for (Workspace *ws = m->workspaces.list; ws; ws = ws->next)
                watch_one(m, ws, disk_full, u.fs_free_bytes);
        r = sd_event_source_set_time_relative(s, WATCH_INTERVAL_USEC);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

/* Before the bus's own exit source, which closes it: the calls answered
 * here must still reach their callers. */
static int on_daemon_exit(sd_event_source *s, void *userdata) {
        manager_stop_workspaces(userdata);
        return 0;
}

int manager_start_workspaces(Manager *m, char **ret_error) {
        _cleanup_(sd_event_source_unrefp) sd_event_source *exit_source = NULL;
        int r;

        r = workspaces_load(&m->workspaces, m->store_path, ret_error);
        if (r < 0)
                return r;
        /* After a restart of the host, or of a server that died. */
        for (Workspace *ws = m->workspaces.list; ws; ws = ws->next)
                (void) workspace_mount(ws, m->store, m->store_path);
        r = sd_event_add_exit(m->event, &exit_source, on_daemon_exit, m);
        if (r >= 0)
                r = sd_event_source_set_priority(exit_source, SD_EVENT_PRIORITY_IMPORTANT);
        if (r >= 0)
                r = sd_event_source_set_floating(exit_source, true);
        if (r < 0)
                return r;
        return sd_event_add_time_relative(m->event, NULL, CLOCK_MONOTONIC, WATCH_INTERVAL_USEC, 0, on_watch, m);
}
