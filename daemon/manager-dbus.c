/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The manager's bus face: org.cowbox1.Manager at /org/cowbox1. Each
 * handler checks its arguments, then the caller (for what changes
 * anything), then does the work; long work becomes a job.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "images.h"
#include "manager.h"
#include "string-util.h"
#include "runtime.h"

#define _cleanup_json_ _cleanup_(json_decrefp)

/* ---- replies ---- */

int manager_check_name(const char *name, sd_bus_error *error) {
        if (!store_name_is_valid(name) || strncmp(name, IMAGE_RECEIVING_PREFIX, strlen(IMAGE_RECEIVING_PREFIX)) == 0)
                return sd_bus_error_setf(error, API_ERROR_INVALID_NAME, "'%.64s' is not a valid name: names are 1 "
                                         "to 255 bytes, without '/' or control characters, not '.' or '..', and "
                                         "not starting with '" IMAGE_RECEIVING_PREFIX "'.", name);
        return 0;
}

int manager_check_new_name(const char *name, sd_bus_error *error) {
        int r = manager_check_name(name, error);

        if (r < 0)
                return r;
        if (startswith(name, WORKSPACE_PREFIX) || startswith(name, SANDBOX_PREFIX))
                return sd_bus_error_setf(error, API_ERROR_INVALID_NAME, "'%.64s' is not a name to give: names "
                                         "starting with '" WORKSPACE_PREFIX "' and '" SANDBOX_PREFIX "' are "
                                         "those of workspaces, their checkpoints and sandboxes, which their own "
                                         "methods make.", name);
        return 0;
}

/* A workspace's or a sandbox's own subvolume is theirs: renamed, deleted
 * or made read-only behind their back, it would leave them broken. */
static int check_not_owned(Manager *m, const char *name, sd_bus_error *error) {
        const Workspace *ws = workspace_find_by_subvolume(&m->workspaces, name, false);

        if (ws)
                return sd_bus_error_setf(error, API_ERROR_BUSY, "'%s' belongs to workspace '%s'; RemoveWorkspace "
                                         "removes it.", name, ws->name);
        if (manager_sandbox_owns(m, name))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "'%s' belongs to a sandbox; DeleteSandbox removes "
                                         "it.", name);
        return 0;
}

int store_error_reply(int r, const char *name, sd_bus_error *error) {
        switch (r) {
        case -ENOENT:
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_SUBVOLUME, "There is no subvolume named '%s'; "
                                         "ListSubvolumes names them.", name);
        case -EEXIST:
                return sd_bus_error_setf(error, API_ERROR_NAME_TAKEN, "The name '%s' is taken; choose another, or "
                                         "delete what has it first.", name);
        case -EBUSY:
                return sd_bus_error_setf(error, API_ERROR_BUSY, "'%s' is in use (mounted, or a sandbox runs in it); "
                                         "stop what uses it, then try again.", name);
        case -ENOSPC:
                return sd_bus_error_setf(error, API_ERROR_NO_SPACE, "The disk under the store is full; delete "
                                         "subvolumes and let the reaper free their space.");
        case -EINVAL:
                return sd_bus_error_setf(error, API_ERROR_INVALID_NAME, "'%s' is not a valid name.", name);
        case -EIO:
        case -EUCLEAN:
                /* Every change of the store is all or nothing: a failed one
                 * left nothing behind. */
                fprintf(stderr, "cowboxd: a call about '%s' failed: %s\n", name, strerror(-r));
                return sd_bus_error_setf(error, API_ERROR_STORE_FAILED, "The store could not read or write what "
                                         "'%s' needs (%s); nothing was changed. cowboxd's log says when; "
                                         "'cowbox-store scrub' checks the store for damage.", name, strerror(-r));
        default:
                return r;
        }
}

/* ---- reading ---- */

static int list(sd_bus_message *message, Manager *m, bool images_only, sd_bus_error *error) {
        _cleanup_json_ json_t *array = json_array();
        StoreSubvolumeInfo *infos = NULL;
        size_t n = 0;
        int r;

        if (!array)
                return -ENOMEM;
        r = store_subvolume_list(m->store, &infos, &n);
        if (r == -EIO || r == -EUCLEAN) {
                fprintf(stderr, "cowboxd: listing the subvolumes failed: %s\n", strerror(-r));
                return sd_bus_error_setf(error, API_ERROR_STORE_FAILED, "The store could not read its subvolumes "
                                         "(%s). cowboxd's log says when; 'cowbox-store scrub' checks the store "
                                         "for damage.", strerror(-r));
        }
        if (r < 0)
                return r;
        for (size_t i = 0; i < n && r >= 0; i++) {
                if (strncmp(infos[i].name, IMAGE_RECEIVING_PREFIX, strlen(IMAGE_RECEIVING_PREFIX)) == 0)
                        continue;
                if (images_only && !infos[i].readonly)
                        continue;
                r = json_array_append_new(array, api_subvolume_to_json(&infos[i])) < 0 ? -ENOMEM : 0;
        }
        store_subvolume_info_array_free(infos, n);
        if (r < 0)
                return r;
        return api_reply_json(message, array);
}

static int method_list_subvolumes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return list(message, userdata, false, error);
}

static int method_list_images(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return list(message, userdata, true, error);
}

static int method_get_subvolume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        StoreSubvolumeInfo info = {};
        const char *name;
        json_t *json;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        r = manager_check_name(name, error);
        if (r < 0)
                return r;
        r = store_subvolume_show(m->store, name, &info);
        if (r < 0)
                return store_error_reply(r, name, error);
        json = api_subvolume_to_json(&info);
        store_subvolume_info_clear(&info);
        r = api_reply_json(message, json);
        json_decref(json);
        return r;
}

static int method_get_status(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *status = NULL, *jobs = json_array();
        Manager *m = userdata;
        StoreReaperSettings reaper = {};
        StoreUsage usage;
        int r;

        r = store_usage(m->store, &usage);
        if (r >= 0)
                r = store_reaper_settings(m->store, &reaper);
        if (r < 0)
                return r;
        for (Job *j = m->jobs; j; j = j->next)
                json_array_append_new(jobs, job_to_json(j));
        status = json_pack("{s:s, s:s, s:o, s:{s:b, s:I, s:I, s:i, s:i, s:b}, s:O}",
                           "store", m->store_path,
                           "version", COWBOX_VERSION,
                           "usage", api_usage_to_json(&usage),
                           "reaper", "paused", reaper.paused,
                           "rate_bytes_per_sec", (json_int_t) reaper.rate_bytes_per_sec,
                           "backlog_bytes", (json_int_t) usage.space.reclaimable_bytes,
                           "low_mark_percent", (int) m->low_mark, "high_mark_percent", (int) m->high_mark,
                           "urgent", m->urgent,
                           "jobs", jobs);
        return api_reply_json(message, status);
}

static int method_list_jobs(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *jobs = json_array();
        Manager *m = userdata;

        for (Job *j = m->jobs; j; j = j->next)
                json_array_append_new(jobs, job_to_json(j));
        return api_reply_json(message, jobs);
}

/* ---- changing ---- */

static int reply_subvolume_path(sd_bus_message *message, const char *name) {
        _cleanup_free_ char *path = NULL;
        int r;

        r = api_subvolume_path(name, &path);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(message, "o", path);
}

static int method_create_subvolume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        r = manager_check_new_name(name, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = store_subvolume_create(m->store, name);
        if (r < 0)
                return store_error_reply(r, name, error);
        (void) manager_signal_subvolume(m, name, true);
        return reply_subvolume_path(message, name);
}

int manager_snapshot(sd_bus_message *message, Manager *m, const char *source, const char *name,
                     const char *options, sd_bus_error *error) {
        static const ApiOption allowed[] = { { "readonly", 'b' }, {} };
        _cleanup_json_ json_t *opts = NULL;
        int r;

        r = manager_check_name(source, error);
        if (r >= 0)
                r = manager_check_new_name(name, error);
        if (r >= 0)
                r = api_parse_options(options, allowed, &opts, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = store_subvolume_snapshot(m->store, source, name, api_option_bool(opts, "readonly", false));
        if (r == -ENOENT)
                return store_error_reply(r, source, error);
        if (r < 0)
                return store_error_reply(r, name, error);
        (void) manager_signal_subvolume(m, name, true);
        return reply_subvolume_path(message, name);
}

static int method_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        const char *source, *name, *options;
        int r;

        r = sd_bus_message_read(message, "sss", &source, &name, &options);
        if (r < 0)
                return r;
        return manager_snapshot(message, userdata, source, name, options, error);
}

int manager_delete(sd_bus_message *message, Manager *m, const char *name, bool image_only, sd_bus_error *error) {
        StoreSubvolumeInfo info = {};
        int r;

        r = manager_check_name(name, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r >= 0)
                r = check_not_owned(m, name, error);
        if (r < 0)
                return r;
        if (image_only) {
                r = store_subvolume_show(m->store, name, &info);
                if (r == -ENOENT)
                        return sd_bus_error_setf(error, API_ERROR_NO_SUCH_IMAGE, "There is no image named '%s'; "
                                                 "ListImages names them.", name);
                if (r < 0)
                        return r;
                r = info.readonly ? 0 : sd_bus_error_setf(error, API_ERROR_NOT_READ_ONLY, "'%s' is a writable "
                                                          "subvolume, not an image; delete it with "
                                                          "DeleteSubvolume.", name);
                store_subvolume_info_clear(&info);
                if (r < 0)
                        return r;
        }
        r = store_subvolume_delete(m->store, name, NULL);
        if (r < 0)
                return store_error_reply(r, name, error);
        (void) manager_signal_subvolume(m, name, false);
        manager_reap_soon(m);
        return sd_bus_reply_method_return(message, NULL);
}

static int method_delete_subvolume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        const char *name;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        return manager_delete(message, userdata, name, false, error);
}

static int method_remove_image(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        const char *name;
        int r;

        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        return manager_delete(message, userdata, name, true, error);
}

static int method_rename(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name, *new_name;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &new_name);
        if (r < 0)
                return r;
        r = manager_check_name(name, error);
        if (r >= 0)
                r = manager_check_new_name(new_name, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r >= 0)
                r = check_not_owned(m, name, error);
        if (r < 0)
                return r;
        r = store_subvolume_rename(m->store, name, new_name);
        if (r == -ENOENT)
                return store_error_reply(r, name, error);
        if (r < 0)
                return store_error_reply(r, new_name, error);
        (void) manager_signal_subvolume(m, name, false);
        (void) manager_signal_subvolume(m, new_name, true);
        return sd_bus_reply_method_return(message, NULL);
}

static int method_set_read_only(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name;
        int readonly, r;

        r = sd_bus_message_read(message, "sb", &name, &readonly);
        if (r < 0)
                return r;
        r = manager_check_name(name, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r >= 0)
                r = check_not_owned(m, name, error);
        if (r < 0)
                return r;
        r = store_subvolume_set_readonly(m->store, name, readonly);
        if (r < 0)
                return store_error_reply(r, name, error);
        return sd_bus_reply_method_return(message, NULL);
}

static int method_set_quota(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *name;
        uint64_t bytes;
        int r;

        r = sd_bus_message_read(message, "st", &name, &bytes);
        if (r < 0)
                return r;
        r = manager_check_name(name, error);
        if (r < 0)
                return r;
        if (bytes > (uint64_t) INT64_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "A quota of %llu bytes is too large; "
                                         "0 means none.", (unsigned long long) bytes);
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        /* A workspace's limit is its quota and more (GetWorkspace's
         * warnings): set it there. */
        if (workspace_find_by_subvolume(&m->workspaces, name, false))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "'%s' belongs to a workspace; SetWorkspaceLimit "
                                         "sets its limit.", name);
        r = check_not_owned(m, name, error);
        if (r < 0)
                return r;
        r = store_subvolume_set_quota(m->store, name, bytes);
        if (r < 0)
                return store_error_reply(r, name, error);
        return sd_bus_reply_method_return(message, NULL);
}

/* ---- jobs ---- */

static void (*worker_progress)(uint64_t done, uint64_t total);

/* A receive from a file reads it twice: it checks the whole of it before it
 * applies anything. The job counts both readings, so that its progress
 * never goes back to 0 between them. */
static bool progress_read_twice;

static void image_progress(const ImageProgress *p, void *userdata) {
        if (streq(p->phase, "verifying"))
                progress_read_twice = true;
        if (!progress_read_twice)
                worker_progress(p->bytes, p->total);
        else if (streq(p->phase, "verifying"))
                worker_progress(p->bytes, 2 * p->total);
        else
                worker_progress(p->total + p->bytes, 2 * p->total);
}

typedef struct StreamWork {
        int fd;
        char *name;
        char *parent;
        unsigned version;
        bool compressed_data;
        bool zstd;
} StreamWork;

static void stream_work_free(void *userdata) {
        StreamWork *w = userdata;

        if (w->fd >= 0)
                close(w->fd);
        free(w->name);
        free(w->parent);
        free(w);
}

static json_t *receive_work(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                            void (*progress)(uint64_t, uint64_t)) {
        /* A stream names its images itself unless given a name: never one
         * that workspaces and sandboxes make for themselves. */
        static const char *const reserved[] = { WORKSPACE_PREFIX, SANDBOX_PREFIX, NULL };
        StreamWork *w = userdata;
        ImageReceiveOptions opts = {
                .name = w->name,
                .reserved_prefixes = reserved,
                .progress = image_progress,
                .no_background_reap = true,
        };
        ImageError error = {};
        char **names = NULL;
        json_t *result, *array, *paths;
        int r;

        worker_progress = progress;
        r = image_receive(s, w->fd, &opts, &names, &error);
        if (r < 0) {
                *ret_error = r;
                if (error.has_offset && asprintf(ret_error_text, "at byte %llu of the stream: %s",
                                                 (unsigned long long) error.offset, error.message) >= 0)
                        return NULL;
                *ret_error_text = strdup(error.message);
                return NULL;
        }
        /* A stream's names may hold bytes that are not UTF-8: shown with
         * U+FFFD, and named exactly by their objects' paths. */
        array = json_array();
        paths = json_array();
        for (char **n = names; n && *n; n++) {
                _cleanup_free_ char *path = NULL;

                json_array_append_new(array, api_json_string_lossy(*n));
                if (api_subvolume_path(*n, &path) >= 0)
                        json_array_append_new(paths, json_string(path));
        }
        image_names_free(names);
        result = json_pack("{s:o, s:o}", "images", array, "paths", paths);
        return result;
}

static json_t *send_work(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                         void (*progress)(uint64_t, uint64_t)) {
        StreamWork *w = userdata;
        ImageSendOptions opts = {
                .parent = w->parent,
                .version = w->version,
                .compressed_data = w->compressed_data,
                .zstd = w->zstd,
                .progress = image_progress,
        };
        ImageError error = {};
        int r;

        worker_progress = progress;
        r = image_send(s, w->name, w->fd, &opts, &error);
        if (r < 0) {
                *ret_error = r;
                *ret_error_text = strdup(error.message);
                return NULL;
        }
        return json_pack("{s:s}", "image", w->name);
}

int reply_job(sd_bus_message *message, Manager *m, int r, Job *j, sd_bus_error *error) {
        _cleanup_free_ char *path = NULL;

        if (r == -EAGAIN)
                return sd_bus_error_setf(error, API_ERROR_TOO_MANY_JOBS, "%d jobs run already; wait for one to "
                                         "finish.", JOBS_MAX);
        if (r < 0)
                return r;
        r = api_job_path(j->id, &path);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(message, "uo", j->id, path);
}

static int start_receive(sd_bus_message *message, Manager *m, int fd, const char *options, sd_bus_error *error) {
        static const ApiOption allowed[] = { { "name", 's' }, {} };
        _cleanup_json_ json_t *opts = NULL;
        StreamWork *w;
        const char *name;
        Job *j = NULL;
        int r;

        r = api_parse_options(options, allowed, &opts, error);
        if (r < 0)
                return r;
        name = api_option_string(opts, "name", NULL);
        if (name) {
                r = manager_check_new_name(name, error);
                if (r < 0)
                        return r;
        }
        w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        w->name = name ? strdup(name) : NULL;
        if (w->fd < 0 || (name && !w->name)) {
                stream_work_free(w);
                return -ENOMEM;
        }
        r = job_start(m, JOB_RECEIVE, name, receive_work, w, stream_work_free, &j);
        return reply_job(message, m, r, j, error);
}

static int method_receive_image(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        const char *options;
        int fd, r;

        r = sd_bus_message_read(message, "hs", &fd, &options);
        if (r < 0)
                return r;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        return start_receive(message, userdata, fd, options, error);
}

static int method_receive_image_from_path(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
        _cleanup_close_ int fd = -EBADF;
        const char *path, *options;
        struct stat st;
        uid_t uid = 1;
        int r;

        r = sd_bus_message_read(message, "ss", &path, &options);
        if (r < 0)
                return r;
        if (path[0] != '/' || strlen(path) >= 4096)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "The path must be absolute.");
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        /* The daemon opens the file with its own rights: only for root.
         * Others pass a file descriptor (ReceiveImage). */
        if (sd_bus_query_sender_creds(message, SD_BUS_CREDS_EUID | SD_BUS_CREDS_AUGMENT, &creds) < 0 ||
            sd_bus_creds_get_euid(creds, &uid) < 0 || uid != 0)
                return sd_bus_error_setf(error, API_ERROR_ACCESS_DENIED, "Only root may name a file for the daemon "
                                         "to read; pass an open file descriptor with ReceiveImage instead.");
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                /* One of the standard names, whatever errno it was. */
                return sd_bus_error_setf(error, errno == ENOENT || errno == ENOTDIR ? SD_BUS_ERROR_FILE_NOT_FOUND :
                                                errno == EACCES || errno == EPERM ? SD_BUS_ERROR_ACCESS_DENIED :
                                                SD_BUS_ERROR_INVALID_ARGS,
                                         "Cannot open %s: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "%s is not a regular file.", path);
        (void) fcntl(fd, F_SETFL, 0);
        return start_receive(message, userdata, fd, options, error);
}

/* An image to send: it exists and is read-only. */
static int check_image(Manager *m, const char *name, sd_bus_error *error) {
        StoreSubvolumeInfo info = {};
        bool readonly;
        int r;

        r = store_subvolume_show(m->store, name, &info);
        if (r == -ENOENT)
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_IMAGE, "There is no image named '%s'; ListImages "
                                         "names them.", name);
        if (r < 0)
                return store_error_reply(r, name, error);
        readonly = info.readonly;
        store_subvolume_info_clear(&info);
        if (!readonly)
                return sd_bus_error_setf(error, API_ERROR_NOT_READ_ONLY, "'%s' is writable: only read-only images "
                                         "can be sent; take a read-only snapshot of it and send that.", name);
        return 0;
}

static int method_send_image(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        static const ApiOption allowed[] = {
                { "parent", 's' }, { "version", 'u' }, { "compressed_data", 'b' }, { "zstd", 'b' }, {}
        };
        _cleanup_json_ json_t *opts = NULL;
        Manager *m = userdata;
        const char *name, *options, *parent;
        StreamWork *w;
        Job *j = NULL;
        int fd, r;

        r = sd_bus_message_read(message, "shs", &name, &fd, &options);
        if (r < 0)
                return r;
        r = manager_check_name(name, error);
        if (r >= 0)
                r = api_parse_options(options, allowed, &opts, error);
        if (r < 0)
                return r;
        parent = api_option_string(opts, "parent", NULL);
        if (parent) {
                r = manager_check_name(parent, error);
                if (r < 0)
                        return r;
        }
        if (api_option_uint(opts, "version", 1) < 1 || api_option_uint(opts, "version", 1) > 2)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"version\" must be 1 or 2.");
        if (api_option_bool(opts, "compressed_data", false) && api_option_uint(opts, "version", 2) == 1)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"compressed_data\" needs "
                                         "\"version\" 2: version 1 streams carry no compressed data.");
        /* Sending reads only; whoever may read the images may send them,
         * but a workspace's checkpoints are its owner's. */
        r = manager_check_workspace_reader(message, m, name, error);
        if (r >= 0 && parent)
                r = manager_check_workspace_reader(message, m, parent, error);
        /* Answered now rather than by a job that fails at once. */
        if (r >= 0)
                r = check_image(m, name, error);
        if (r >= 0 && parent)
                r = check_image(m, parent, error);
        if (r < 0)
                return r;
        w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        w->name = strdup(name);
        w->parent = parent ? strdup(parent) : NULL;
        w->compressed_data = api_option_bool(opts, "compressed_data", false);
        w->version = (unsigned) api_option_uint(opts, "version", w->compressed_data ? 2 : 1);
        w->zstd = api_option_bool(opts, "zstd", false);
        if (w->fd < 0 || !w->name || (parent && !w->parent)) {
                stream_work_free(w);
                return -ENOMEM;
        }
        r = job_start(m, JOB_SEND, name, send_work, w, stream_work_free, &j);
        return reply_job(message, m, r, j, error);
}

/* A job worker's progress, passed on from the store's callbacks. */
typedef struct JobProgress {
        void (*progress)(uint64_t done, uint64_t total);
} JobProgress;

static void job_progress(uint64_t done, uint64_t total, void *userdata) {
        const JobProgress *p = userdata;

        p->progress(done, total);
}

typedef struct ScrubJob {
        JobProgress progress;   /* first: the store's progress callback takes the whole */
        json_t *damage;
} ScrubJob;

static void scrub_damage(const StoreDamage *d, void *userdata) {
        ScrubJob *job = userdata;

        /* Names and paths may hold bytes that are not UTF-8: each damaged
         * file is listed all the same. */
        if (json_array_size(job->damage) < 1000)
                json_array_append_new(job->damage,
                                      json_pack("{s:s, s:s, s:o?, s:o?}", "digest", d->digest, "reason", d->reason,
                                                "subvolume", d->subvolume ? api_json_string_lossy(d->subvolume) : NULL,
                                                "path", d->path ? api_json_string_lossy(d->path) : NULL));
}

static json_t *scrub_work(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                          void (*progress)(uint64_t, uint64_t)) {
        json_t *damage = json_array();
        ScrubJob job = { .progress.progress = progress, .damage = damage };
        StoreScrubStats stats = {};
        int r;

        r = store_scrub(s, scrub_damage, job_progress, &job, &stats);
        if (r < 0) {
                json_decref(damage);
                *ret_error = r;
                return NULL;
        }
        return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
                         "blocks_checked", (json_int_t) stats.blocks_checked,
                         "bytes_checked", (json_int_t) stats.bytes_checked,
                         "blocks_damaged", (json_int_t) stats.blocks_damaged,
                         "files_damaged", (json_int_t) stats.files_damaged,
                         "rows_checked", (json_int_t) stats.rows_checked,
                         "rows_damaged", (json_int_t) stats.rows_damaged,
                         "damage", damage);
}

static json_t *reap_work(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                         void (*progress)(uint64_t, uint64_t)) {
        const SandboxLimits low = { .io_weight = REAPER_IO_WEIGHT };
        Manager *m = userdata;
        json_t *unapplied = json_array();
        StoreReapStats stats = {};
        char **not_applied = NULL;
        int r;

        /* The reaper gives way to the foreground: a cgroup of its own at a
         * low I/O weight, where the host has one. */
        (void) runtime_enter_cgroup("reaper", m->cgroup_base, &low, store_path(s), &not_applied);
        for (char **p = not_applied; p && *p; p++) {
                json_array_append_new(unapplied, json_string(*p));
                free(*p);
        }
        free(not_applied);

        r = store_reap(s, true, job_progress, &(JobProgress) { progress }, &stats, NULL);
        if (r < 0 && r != -EAGAIN) {
                *ret_error = r;
                return NULL;
        }
        return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:i, s:o}",
                         "paused", r == -EAGAIN,
                         "subvolumes_forgotten", (json_int_t) stats.subvolumes_forgotten,
                         "layers_dropped", (json_int_t) stats.layers_dropped,
                         "layers_folded", (json_int_t) stats.layers_folded,
                         "blocks_freed", (json_int_t) stats.blocks_freed,
                         "bytes_freed", (json_int_t) stats.bytes_freed,
                         "io_weight", REAPER_IO_WEIGHT,
                         "not_applied", unapplied);
}

static int method_scrub(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Job *j = NULL;
        int r;

        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = job_start(userdata, JOB_SCRUB, NULL, scrub_work, NULL, NULL, &j);
        return reply_job(message, userdata, r, j, error);
}

int manager_start_reap(Manager *m, Job **ret) {
        Job *j = NULL;
        int r;

        r = job_start(m, JOB_REAP, NULL, reap_work, m, NULL, &j);
        if (r >= 0 && ret)
                *ret = j;
        return r;
}

static int method_reap(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Job *j = NULL;
        int r;

        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = manager_start_reap(userdata, &j);
        return reply_job(message, userdata, r, j, error);
}

static int method_cancel_job(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        uint32_t id;
        Job *j;
        int r;

        r = sd_bus_message_read(message, "u", &id);
        if (r < 0)
                return r;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        j = manager_find_job(m, id);
        if (!j || job_cancel(j) < 0)
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_JOB, "There is no running job %u.", id);
        return sd_bus_reply_method_return(message, NULL);
}

static int property_store(sd_bus *bus, const char *path, const char *interface, const char *property,
                          sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;

        return sd_bus_message_append(reply, "s", m->store_path);
}

static int property_version(sd_bus *bus, const char *path, const char *interface, const char *property,
                            sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", COWBOX_VERSION);
}

const sd_bus_vtable manager_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Store", "s", property_store, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Version", "s", property_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_METHOD_WITH_ARGS("ListSubvolumes", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", subvolumes_json),
                                method_list_subvolumes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListImages", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", images_json),
                                method_list_images, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetSubvolume", SD_BUS_ARGS("s", name), SD_BUS_RESULT("s", subvolume_json),
                                method_get_subvolume, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetStatus", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", status_json),
                                method_get_status, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListJobs", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", jobs_json),
                                method_list_jobs, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateSubvolume", SD_BUS_ARGS("s", name), SD_BUS_RESULT("o", path),
                                method_create_subvolume, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Snapshot", SD_BUS_ARGS("s", source, "s", name, "s", options_json),
                                SD_BUS_RESULT("o", path), method_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("DeleteSubvolume", SD_BUS_ARGS("s", name), SD_BUS_NO_RESULT,
                                method_delete_subvolume, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RemoveImage", SD_BUS_ARGS("s", name), SD_BUS_NO_RESULT,
                                method_remove_image, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Rename", SD_BUS_ARGS("s", name, "s", new_name), SD_BUS_NO_RESULT,
                                method_rename, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetReadOnly", SD_BUS_ARGS("s", name, "b", read_only), SD_BUS_NO_RESULT,
                                method_set_read_only, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetQuota", SD_BUS_ARGS("s", name, "t", bytes), SD_BUS_NO_RESULT,
                                method_set_quota, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReceiveImage", SD_BUS_ARGS("h", stream, "s", options_json),
                                SD_BUS_RESULT("u", job_id, "o", job_path), method_receive_image,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReceiveImageFromPath", SD_BUS_ARGS("s", path, "s", options_json),
                                SD_BUS_RESULT("u", job_id, "o", job_path), method_receive_image_from_path,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SendImage", SD_BUS_ARGS("s", name, "h", stream, "s", options_json),
                                SD_BUS_RESULT("u", job_id, "o", job_path), method_send_image,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Scrub", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", job_id, "o", job_path),
                                method_scrub, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Reap", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", job_id, "o", job_path),
                                method_reap, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RunTask", SD_BUS_ARGS("s", source, "as", command, "s", options_json),
                                SD_BUS_RESULT("u", job_id, "o", job_path), method_run_task,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateSandbox", SD_BUS_ARGS("s", name, "s", image, "as", command,
                                                         "s", options_json),
                                SD_BUS_RESULT("s", sandbox_json), method_create_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("StartSandbox", SD_BUS_ARGS("s", name), SD_BUS_RESULT("u", job_id, "o", job_path),
                                method_start_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("WaitSandbox", SD_BUS_ARGS("s", name), SD_BUS_RESULT("s", sandbox_json),
                                method_wait_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("KillSandbox", SD_BUS_ARGS("s", name), SD_BUS_NO_RESULT,
                                method_kill_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("DeleteSandbox", SD_BUS_ARGS("s", name), SD_BUS_NO_RESULT,
                                method_delete_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListSandboxes", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", sandboxes_json),
                                method_list_sandboxes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CancelJob", SD_BUS_ARGS("u", job_id), SD_BUS_NO_RESULT,
                                method_cancel_job, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateWorkspace", SD_BUS_ARGS("s", name, "s", options_json),
                                SD_BUS_RESULT("s", workspace_json), method_create_workspace,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListWorkspaces", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", workspaces_json),
                                method_list_workspaces, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetWorkspace", SD_BUS_ARGS("s", name), SD_BUS_RESULT("s", workspace_json),
                                method_get_workspace, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RemoveWorkspace", SD_BUS_ARGS("s", name), SD_BUS_NO_RESULT,
                                method_remove_workspace, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetWorkspaceLimit", SD_BUS_ARGS("s", name, "t", bytes), SD_BUS_NO_RESULT,
                                method_set_workspace_limit, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CheckpointWorkspace", SD_BUS_ARGS("s", name, "s", label), SD_BUS_NO_RESULT,
                                method_checkpoint_workspace, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RestoreWorkspace", SD_BUS_ARGS("s", name, "s", label), SD_BUS_NO_RESULT,
                                method_restore_workspace, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListCheckpoints", SD_BUS_ARGS("s", name), SD_BUS_RESULT("s", checkpoints_json),
                                method_list_checkpoints, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_SIGNAL_WITH_ARGS("WorkspaceWarning", SD_BUS_ARGS("s", name, "t", used_bytes, "t", limit_bytes), 0),
        SD_BUS_SIGNAL_WITH_ARGS("WorkspaceFull", SD_BUS_ARGS("s", name, "t", used_bytes, "t", limit_bytes), 0),
        SD_BUS_SIGNAL_WITH_ARGS("WorkspaceDiskFull", SD_BUS_ARGS("s", name, "t", free_bytes), 0),
        SD_BUS_SIGNAL_WITH_ARGS("SubvolumeNew", SD_BUS_ARGS("s", name, "o", path), 0),
        SD_BUS_SIGNAL_WITH_ARGS("SubvolumeRemoved", SD_BUS_ARGS("s", name, "o", path), 0),
        SD_BUS_SIGNAL_WITH_ARGS("JobNew", SD_BUS_ARGS("u", job_id, "o", job_path), 0),
        SD_BUS_SIGNAL_WITH_ARGS("JobRemoved", SD_BUS_ARGS("u", job_id, "o", job_path, "s", result,
                                                          "s", result_json), 0),
        SD_BUS_VTABLE_END
};
