/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "images.h"
#include "manager.h"
#include "process-util.h"
#include "runtime.h"
#include "string-util.h"

int manager_new(const char *store_path, Manager **ret) {
        Manager *m;
        int r;

        m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->low_mark = 10;
        m->high_mark = 20;
        /* Absolute, whatever the caller's directory: workspaces' mount
         * points are made from it and looked up in the kernel's mount
         * table, and servers and workers open it from other directories. */
        m->store_path = realpath(store_path, NULL);
        if (!m->store_path) {
                r = -errno;
                free(m);
                return r;
        }
        r = store_open(m->store_path, &m->store);
        if (r < 0) {
                manager_free(m);
                return r;
        }
        *ret = m;
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        /* Done in the event loop's exit, unless the loop failed. Before
         * the workers are stopped: a removal answered here starts a reap. */
        manager_stop_workspaces(m);
        for (Job *j = m->jobs; j; j = j->next)
                if (j->worker > 0)
                        (void) kill(j->worker, SIGTERM);
        sd_bus_flush_close_unref(m->bus);
        sd_event_unref(m->event);
        workspaces_done(&m->workspaces);
        manager_free_sandboxes(m);
        manager_subvolume_cache_drop(m);
        store_close(m->store);
        free(m->store_path);
        free(m->cgroup_base);
        free(m);
        return NULL;
}

void manager_reap_soon(Manager *m) {
        /* A reap job (its worker keeps no bus connection of the daemon),
         * unless one runs already: it reaps what comes meanwhile too. */
        for (Job *j = m->jobs; j; j = j->next)
                if (j->type == JOB_REAP && j->state == JOB_RUNNING)
                        return;
        (void) manager_start_reap(m, NULL);
}

/* Removes what receives and sandboxes killed with -9 left; whether any
 * subvolume was deleted. */
static bool remove_stale(Manager *m) {
        int receives = image_remove_stale_receives(m->store);
        int sandboxes = sandbox_remove_stale(m->store);

        return receives > 0 || sandboxes > 0;
}

void manager_recover(Manager *m) {
        StoreSpace space;

        task_remove_stale_outputs(m->store_path);
        if (remove_stale(m) ||
            (store_space(m->store, &space) >= 0 && space.reclaimable_bytes > 0))
                manager_reap_soon(m);
}

static bool caller_in_group(sd_bus_creds *creds, uid_t uid, gid_t group) {
        const gid_t *gids;
        gid_t egid;
        int n;

        if (sd_bus_creds_get_egid(creds, &egid) >= 0 && egid == group)
                return true;
        n = sd_bus_creds_get_supplementary_gids(creds, &gids);
        if (n >= 0) {
                for (int i = 0; i < n; i++)
                        if (gids[i] == group)
                                return true;
                return false;
        }
        /* The bus did not say: ask the group database about the user. */
        {
                struct passwd *pw = getpwuid(uid);
                gid_t list[256];
                int count = (int) (sizeof list / sizeof list[0]);

                if (!pw || getgrouplist(pw->pw_name, pw->pw_gid, list, &count) < 0)
                        return false;
                for (int i = 0; i < count; i++)
                        if (list[i] == group)
                                return true;
        }
        return false;
}

int manager_caller_identity(sd_bus_message *message, uid_t *ret_uid, bool *ret_may_change) {
        _cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
        struct group *gr;
        uid_t uid;
        int r;

        r = sd_bus_query_sender_creds(message, SD_BUS_CREDS_EUID | SD_BUS_CREDS_EGID |
                                      SD_BUS_CREDS_SUPPLEMENTARY_GIDS | SD_BUS_CREDS_AUGMENT, &creds);
        if (r < 0)
                return r;
        r = sd_bus_creds_get_euid(creds, &uid);
        if (r < 0)
                return r;
        *ret_uid = uid;
        gr = uid == 0 ? NULL : getgrnam(API_GROUP);
        *ret_may_change = uid == 0 || (gr && caller_in_group(creds, uid, gr->gr_gid));
        return 0;
}

int manager_check_caller(sd_bus_message *message, sd_bus_error *error) {
        bool may_change;
        uid_t uid;
        int r;

        r = manager_caller_identity(message, &uid, &may_change);
        if (r < 0)
                return r;
        if (may_change)
                return 0;
        return sd_bus_error_setf(error, API_ERROR_ACCESS_DENIED, "Only root and members of the group '%s' may "
                                 "change the store; ask an administrator to add you to it.", API_GROUP);
}

void manager_subvolume_cache_drop(Manager *m) {
        if (m->subvolume_cache_valid)
                store_subvolume_info_clear(&m->subvolume_cache);
        m->subvolume_cache_valid = false;
}

int manager_subvolume_info(Manager *m, const char *name, const StoreSubvolumeInfo **ret) {
        uint64_t iteration = 0;
        int r;

        (void) sd_event_get_iteration(m->event, &iteration);
        /* One message is dispatched per turn, and whoever changes a
         * subvolume in it announces that after the change. */
        if (!m->subvolume_cache_valid || m->subvolume_cache_iteration != iteration ||
            !streq(m->subvolume_cache.name, name)) {
                manager_subvolume_cache_drop(m);
                r = store_subvolume_show(m->store, name, &m->subvolume_cache);
                if (r < 0)
                        return r;
                m->subvolume_cache_valid = true;
                m->subvolume_cache_iteration = iteration;
        }
        *ret = &m->subvolume_cache;
        return 0;
}

int manager_signal_subvolume(Manager *m, const char *name, bool added) {
        _cleanup_free_ char *path = NULL;
        json_t *text;
        int r;

        manager_subvolume_cache_drop(m);

        r = api_subvolume_path(name, &path);
        if (r < 0)
                return r;
        /* A received image's name may not be UTF-8; its path says it. */
        text = api_json_string_lossy(name);
        if (!text)
                return -ENOMEM;
        r = sd_bus_emit_signal(m->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE,
                               added ? "SubvolumeNew" : "SubvolumeRemoved", "so", json_string_value(text), path);
        json_decref(text);
        if (r < 0)
                return r;
        /* The object manager's clients learn of objects only from these. */
        return added ? sd_bus_emit_interfaces_added(m->bus, path, API_SUBVOLUME_INTERFACE, NULL)
                     : sd_bus_emit_interfaces_removed(m->bus, path, API_SUBVOLUME_INTERFACE, NULL);
}

/* A task's snapshot kept (RunTask's "keep") is a new subvolume; a
 * sandbox's own was announced when the sandbox was made. */
static void signal_kept_snapshot(Manager *m, Job *j) {
        StoreSubvolumeInfo info = {};
        json_t *doc;
        const char *name;

        if (j->state != JOB_DONE || !j->result)
                return;
        doc = json_loads(j->result, JSON_ALLOW_NUL, NULL);
        name = json_string_value(json_object_get(doc, "snapshot"));
        if (name && !startswith(name, SANDBOX_PREFIX) && store_subvolume_show(m->store, name, &info) >= 0) {
                store_subvolume_info_clear(&info);
                (void) manager_signal_subvolume(m, name, true);
        }
        json_decref(doc);
}

void manager_job_finished(Manager *m, Job *j) {
        if (j->type == JOB_REAP && j->state == JOB_DONE && j->result) {
                json_t *doc = json_loads(j->result, JSON_ALLOW_NUL, NULL);

                if (json_is_true(json_object_get(doc, "paused")))
                        m->reap_deferred = true;
                json_decref(doc);
        }
        if (j->type == JOB_RUN) {
                manager_sandbox_job_finished(m, j);
                signal_kept_snapshot(m, j);
        }
        /* A worker that died in the middle of a receive leaves a
         * half-received image behind; a scrub or a reap nothing. */
        if (j->type == JOB_RECEIVE && j->state != JOB_DONE)
                manager_recover(m);
        if (j->type == JOB_RECEIVE && j->state == JOB_DONE && j->result) {
                json_t *doc = json_loads(j->result, JSON_ALLOW_NUL, NULL);
                json_t *paths = json_object_get(doc, "paths");
                size_t i;
                json_t *v;

                /* By their paths: a name shown with U+FFFD is not the
                 * image's own. */
                json_array_foreach(paths, i, v) {
                        _cleanup_free_ char *name = NULL;

                        if (json_is_string(v) && api_subvolume_name_from_path(json_string_value(v), &name) > 0)
                                (void) manager_signal_subvolume(m, name, true);
                }
                json_decref(doc);
        }
}

#define SPACE_WATCH_USEC (2 * 1000 * 1000)
#define RECOVER_TICKS 30

/* Below the low mark of free space, the reapers are hurried (their rate
 * bound lifted) and a reap started; at the high mark (or with nothing left
 * to free), the hurry ends. It is renewed at every look: should the daemon
 * die meanwhile, it ends by itself, and the rate set was never touched.
 * Work a paused reaper left is taken up once it is resumed. */
static void watch_space(Manager *m) {
        StoreReaperSettings settings;
        StoreSpace u;
        unsigned free_percent;

        if (m->recover_ticks > 0) {
                m->recover_ticks--;
                if (remove_stale(m))
                        manager_reap_soon(m);
        }

        if (store_space(m->store, &u) < 0 || u.fs_total_bytes == 0)
                return;
        if (store_reaper_settings(m->store, &settings) >= 0) {
                if (settings.paused)
                        m->reap_deferred = true;
                else if (m->reap_deferred) {
                        m->reap_deferred = false;
                        if (u.reclaimable_bytes > 0)
                                manager_reap_soon(m);
                }
        }
        free_percent = (unsigned) (u.fs_free_bytes * 100 / u.fs_total_bytes);
        if (free_percent < m->low_mark && u.reclaimable_bytes > 0) {
                m->urgent = true;
                manager_reap_soon(m);
        } else if (m->urgent && (free_percent >= m->high_mark || u.reclaimable_bytes == 0)) {
                m->urgent = false;
                (void) store_reaper_hurry(m->store, false);
        }
        if (m->urgent)
                (void) store_reaper_hurry(m->store, true);
}

static int on_space_watch(sd_event_source *s, uint64_t usec, void *userdata) {
        int r;

        watch_space(userdata);
        r = sd_event_source_set_time_relative(s, SPACE_WATCH_USEC);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;

        return sd_event_exit(m->event, 0);
}

/* One daemon a store: a second would recover, mount and remove what the
 * first is using. STORE-sandboxes/.cowboxd names the daemon that serves
 * the store by its identity, which a daemon killed with -9 leaves behind
 * and the next one takes over. A lock held for the moment of the check
 * (not for the daemon's life: its workers and servers, forked, would
 * inherit it and outlive it) keeps two starting daemons apart. */
static int claim_store(Manager *m, char **ret_error) {
        _cleanup_free_ char *dir = NULL, *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        char text[PROCESS_IDENTITY_TEXT_MAX + 1] = {}, self[PROCESS_IDENTITY_TEXT_MAX];
        pid_t pid = 0;
        int r;

        if (asprintf(&dir, "%s-sandboxes", m->store_path) < 0 || asprintf(&path, "%s/.cowboxd", dir) < 0)
                return -ENOMEM;
        (void) mkdir(dir, 0755);
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 || flock(fd, LOCK_EX) < 0)
                return -errno;
        r = process_identity_text_self(self);
        if (r < 0)
                return r;
        if (pread(fd, text, sizeof text - 1, 0) > 0) {
                r = process_identity_text_alive(text, &pid);
                if (r > 0 && pid != getpid()) {
                        if (asprintf(ret_error, "another cowboxd (PID %d) serves the store at %s", (int) pid,
                                     m->store_path) < 0)
                                *ret_error = NULL;
                        return -EBUSY;
                }
                /* Its PID cannot be looked up from here: a container's
                 * daemon is restarted in a new namespace, and would
                 * otherwise never take its store back. */
                if (r == -EXDEV)
                        fprintf(stderr, "cowboxd: the store was last served by a cowboxd of another PID "
                                "namespace (PID %d there); taking it over.\n", (int) pid);
        }
        if (ftruncate(fd, 0) < 0 || dprintf(fd, "%s\n", self) < 0)
                return -errno;
        return 0;
}

int manager_start(Manager *m, char **ret_error) {
        int r;

        r = claim_store(m, ret_error);
        if (r < 0)
                return r;

        r = sd_event_default(&m->event);
        if (r < 0)
                return r;
        {
                sigset_t mask;

                sigemptyset(&mask);
                sigaddset(&mask, SIGTERM);
                sigaddset(&mask, SIGINT);
                sigaddset(&mask, SIGCHLD);
                if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                        return -errno;
        }
        r = sd_event_add_signal(m->event, NULL, SIGTERM, on_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, NULL, SIGINT, on_signal, m);
        if (r < 0)
                return r;

        /* The system bus, or the one DBUS_SYSTEM_BUS_ADDRESS names. */
        r = sd_bus_open_system(&m->bus);
        if (r < 0)
                return r;
        r = sd_bus_add_object_vtable(m->bus, NULL, API_MANAGER_PATH, API_MANAGER_INTERFACE, manager_vtable, m);
        if (r >= 0)
                r = sd_bus_add_fallback_vtable(m->bus, NULL, API_SUBVOLUME_PREFIX, API_SUBVOLUME_INTERFACE,
                                               subvolume_vtable, subvolume_object_find, m);
        if (r >= 0)
                r = sd_bus_add_node_enumerator(m->bus, NULL, API_SUBVOLUME_PREFIX, subvolume_node_enumerator, m);
        if (r >= 0)
                r = sd_bus_add_fallback_vtable(m->bus, NULL, API_JOB_PREFIX, API_JOB_INTERFACE, job_vtable,
                                               job_object_find, m);
        if (r >= 0)
                r = sd_bus_add_node_enumerator(m->bus, NULL, API_JOB_PREFIX, job_node_enumerator, m);
        if (r >= 0)
                r = sd_bus_add_fallback_vtable(m->bus, NULL, API_SANDBOX_PREFIX, API_SANDBOX_INTERFACE,
                                               sandbox_vtable, sandbox_object_find, m);
        if (r >= 0)
                r = sd_bus_add_node_enumerator(m->bus, NULL, API_SANDBOX_PREFIX, sandbox_node_enumerator, m);
        if (r >= 0)
                r = sd_bus_add_object_manager(m->bus, NULL, API_MANAGER_PATH);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(m->bus, m->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;

        manager_recover(m);
        m->recover_ticks = RECOVER_TICKS;
        r = sd_event_add_time_relative(m->event, NULL, CLOCK_MONOTONIC, SPACE_WATCH_USEC, 0, on_space_watch, m);
        if (r >= 0)
                r = manager_start_workspaces(m, ret_error);
        if (r >= 0)
                r = manager_load_sandboxes(m, ret_error);
        if (r < 0)
                return r;

        /* The name last: once it is taken, callers find everything ready.
         * A daemon killed a moment ago may still hold it while the last of
         * its processes goes: wait a little for it. */
        for (unsigned i = 0;; i++) {
                r = sd_bus_request_name(m->bus, API_SERVICE, 0);
                if (r != -EEXIST || i >= 150)
                        return r;
                (void) usleep(200 * 1000);
        }
}

int manager_run(Manager *m) {
        return sd_event_loop(m->event);
}
