/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Sandboxes with a life of their own: created (a snapshot of an image that
 * belongs to the sandbox, and the command with its limits), started (a
 * job that runs the command in that snapshot), waited for, killed and
 * deleted (with the snapshot: nothing is left behind). The list is kept in
 * a JSON file next to the store, so that after a restart of the daemon a
 * sandbox whose task was running is known to have died.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "manager.h"
#include "runtime.h"
#include "state-file.h"
#include "string-util.h"
#include "workspace.h"

#define _cleanup_json_ _cleanup_(json_decrefp)
#define WAITERS_MAX 64
/* Of those, one caller's: no caller takes every place. */
#define WAITERS_PER_CALLER 8
/* Anyone may wait: those who may not change the store take half the places
 * together at most, and one user of them one caller's share, so that root
 * and the group can always wait for their sandboxes. */
#define WAITERS_UNPRIVILEGED_MAX (WAITERS_MAX / 2)
/* How long a delete waits for a snapshot's holder to let go. */
#define DELETE_RETRY_USEC (100 * 1000)
#define DELETE_RETRIES 100

/* A WaitSandbox call waiting for the run's end, and its caller on the bus:
 * a caller that left needs no reply and gives its place up. */
typedef struct SandboxWaiter {
        sd_bus_message *message;
        sd_bus_track *caller;
        uid_t uid;
        bool unprivileged;
} SandboxWaiter;

struct Sandbox {
        char *name;
        char *image;
        json_t *command;        /* array of strings */
        json_t *options;        /* object */
        char *state;            /* created, running, exited, failed, killed */
        json_t *result;         /* of the last run, or NULL */
        uint32_t job;
        SandboxWaiter waiters[WAITERS_MAX];
        size_t n_waiters;
        /* A DeleteSandbox waiting for the snapshot to be let go. */
        Manager *manager;
        sd_bus_message *delete_call;
        sd_event_source *delete_retry;
        unsigned delete_tries;
        struct Sandbox *next;
};

static char *state_file(Manager *m) {
        char *path;

        return asprintf(&path, "%s-sandboxes/.sandboxes.json", m->store_path) < 0 ? NULL : path;
}

static int save(Manager *m) {
        _cleanup_free_ char *path = state_file(m);
        _cleanup_json_ json_t *list = json_array();

        if (!path || !list)
                return -ENOMEM;
        for (Sandbox *b = m->sandboxes; b; b = b->next)
                json_array_append_new(list, json_pack("{s:s, s:s, s:O, s:O, s:s, s:O?}", "name", b->name,
                                                      "image", b->image, "command", b->command,
                                                      "options", b->options, "state", b->state,
                                                      "result", b->result));
        return state_file_save(path, list);
}

static void waiter_clear(SandboxWaiter *w) {
        w->message = sd_bus_message_unref(w->message);
        w->caller = sd_bus_track_unref(w->caller);
}

/* Drops the waiters whose callers left the bus. */
static void prune_waiters(Sandbox *b) {
        size_t k = 0;

        for (size_t i = 0; i < b->n_waiters; i++) {
                if (sd_bus_track_count(b->waiters[i].caller) > 0)
                        b->waiters[k++] = b->waiters[i];
                else
                        waiter_clear(&b->waiters[i]);
        }
        b->n_waiters = k;
}

static Sandbox *sandbox_free(Sandbox *b) {
        if (!b)
                return NULL;
        for (size_t i = 0; i < b->n_waiters; i++)
                waiter_clear(&b->waiters[i]);
        sd_bus_message_unref(b->delete_call);
        sd_event_source_disable_unref(b->delete_retry);
        free(b->name);
        free(b->image);
        free(b->state);
        json_decref(b->command);
        json_decref(b->options);
        json_decref(b->result);
        free(b);
        return NULL;
}

void manager_free_sandboxes(Manager *m) {
        while (m->sandboxes) {
                Sandbox *next = m->sandboxes->next;

                sandbox_free(m->sandboxes);
                m->sandboxes = next;
        }
}

static int set_state(Sandbox *b, const char *state) {
        char *s = strdup(state);

        if (!s)
                return -ENOMEM;
        free(b->state);
        b->state = s;
        return 0;
}

int manager_load_sandboxes(Manager *m, char **ret_error) {
        _cleanup_free_ char *path = state_file(m), *dir = NULL;
        json_t *list, *v;
        size_t i;
        int r;

        if (!path || asprintf(&dir, "%s-sandboxes", m->store_path) < 0)
                return -ENOMEM;
        (void) mkdir(dir, 0755);
        /* Their snapshots are protected only while the list names them. */
        r = state_file_load(path, "sandboxes", JSON_ALLOW_NUL, &list, ret_error);
        if (r < 0)
                return r;
        if (list && !json_is_array(list)) {
                json_decref(list);
                if (asprintf(ret_error, "the list of sandboxes %s is damaged: it is not an array; repair it, or "
                             "move it aside to start with none", path) < 0)
                        *ret_error = NULL;
                return -EUCLEAN;
        }
        json_array_foreach(list, i, v) {
                Sandbox *b = calloc(1, sizeof *b);
                const char *state = json_string_value(json_object_get(v, "state"));

                if (!b)
                        break;
                b->name = strdup(json_string_value(json_object_get(v, "name")) ?: "");
                b->image = strdup(json_string_value(json_object_get(v, "image")) ?: "");
                b->command = json_incref(json_object_get(v, "command"));
                b->options = json_incref(json_object_get(v, "options"));
                /* Its job died with the daemon that ran it. The result
                 * saved is an earlier run's: that one's exit would be
                 * read as this one's. */
                if (state && !streq(state, "running"))
                        b->result = json_incref(json_object_get(v, "result"));
                else
                        b->result = json_pack("{s:i, s:s}", "errno", ECANCELED, "error", "cowboxd stopped while "
                                              "the task ran, and the task with it");
                b->state = strdup(state && !streq(state, "running") ? state : "failed");
                if (!b->name || !b->image || !b->state || !json_is_array(b->command) || !json_is_object(b->options)) {
                        sandbox_free(b);
                        continue;
                }
                b->next = m->sandboxes;
                m->sandboxes = b;
        }
        json_decref(list);
        return save(m);
}

static Sandbox *find(Manager *m, const char *name, sd_bus_error *error) {
        for (Sandbox *b = m->sandboxes; b; b = b->next)
                if (streq(b->name, name))
                        return b;
        sd_bus_error_setf(error, API_ERROR_NO_SUCH_SANDBOX, "There is no sandbox named '%.64s'; ListSandboxes "
                          "names them.", name);
        return NULL;
}

bool manager_sandbox_owns(Manager *m, const char *subvolume) {
        if (!startswith(subvolume, SANDBOX_PREFIX))
                return false;
        for (Sandbox *b = m->sandboxes; b; b = b->next)
                if (streq(b->name, subvolume + strlen(SANDBOX_PREFIX)))
                        return true;
        return false;
}

/* A task's output may hold what only those who may run tasks should read
 * (a build's tokens, say): anyone else, and every signal, gets the rest of
 * the result without it. */
static json_t *sandbox_to_json(const Sandbox *b, bool with_output) {
        _cleanup_json_ json_t *trimmed = NULL;
        json_t *result = b->result;

        if (result && !with_output) {
                trimmed = json_copy(result);
                if (!trimmed)
                        return NULL;
                (void) json_object_del(trimmed, "stdout");
                (void) json_object_del(trimmed, "stderr");
                result = trimmed;
        }
        return json_pack("{s:s, s:s, s:O, s:O, s:s, s:s+, s:i, s:O?}", "name", b->name, "image", b->image,
                         "command", b->command, "options", b->options, "state", b->state,
                         "snapshot", SANDBOX_PREFIX, b->name, "job", (int) b->job, "result", result);
}

static bool caller_sees_output(sd_bus_message *message) {
        bool may_change = false;
        uid_t uid;

        return message && manager_caller_identity(message, &uid, &may_change) >= 0 && may_change;
}

static char *sandbox_text(const Sandbox *b, bool with_output) {
        _cleanup_json_ json_t *doc = sandbox_to_json(b, with_output);

        return doc ? api_json_text(doc) : NULL;
}

static void reply_waiters(Sandbox *b) {
        _cleanup_free_ char *text = sandbox_text(b, true), *trimmed = sandbox_text(b, false);

        for (size_t i = 0; i < b->n_waiters; i++) {
                const char *answer = b->waiters[i].unprivileged ? trimmed : text;

                if (answer)
                        (void) sd_bus_reply_method_return(b->waiters[i].message, "s", answer);
                waiter_clear(&b->waiters[i]);
        }
        b->n_waiters = 0;
}

void manager_sandbox_job_finished(Manager *m, Job *j) {
        for (Sandbox *b = m->sandboxes; b; b = b->next) {
                if (b->job != j->id || !streq(b->state, "running"))
                        continue;
                json_decref(b->result);
                b->result = j->result ? json_loads(j->result, JSON_ALLOW_NUL, NULL) : NULL;
                /* A run that failed before its task ran says why. */
                if (!b->result && j->state == JOB_FAILED)
                        b->result = json_pack("{s:i, s:s}", "errno", -j->error,
                                              "error", j->error_text ? j->error_text : "the run failed");
                (void) set_state(b, j->state == JOB_DONE ? "exited" : j->state == JOB_CANCELLED ? "killed" : "failed");
                (void) save(m);
                reply_waiters(b);
        }
}

/* Takes b off the list, unsaved: one that never had a snapshot. */
static void unlist(Manager *m, Sandbox *b) {
        for (Sandbox **p = &m->sandboxes; *p; p = &(*p)->next)
                if (*p == b) {
                        *p = b->next;
                        break;
                }
        sandbox_free(b);
}

/* InterfacesAdded or InterfacesRemoved of a sandbox's object: the object
 * manager's clients learn of objects only from these. */
static void signal_sandbox(Manager *m, const char *name, bool added) {
        _cleanup_free_ char *path = NULL;

        if (sd_bus_path_encode(API_SANDBOX_PREFIX, name, &path) < 0)
                return;
        if (added)
                (void) sd_bus_emit_interfaces_added(m->bus, path, API_SANDBOX_INTERFACE, NULL);
        else
                (void) sd_bus_emit_interfaces_removed(m->bus, path, API_SANDBOX_INTERFACE, NULL);
}

int method_create_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *opts = NULL, *doc = NULL;
        _cleanup_free_ char *snapshot = NULL;
        Manager *m = userdata;
        const char *name, *image, *options;
        char **argv = NULL;
        Sandbox *b = NULL;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &image);
        if (r >= 0)
                r = sd_bus_message_read_strv(message, &argv);
        if (r >= 0)
                r = sd_bus_message_read(message, "s", &options);
        if (r >= 0 && !workspace_name_is_valid(name))
                r = sd_bus_error_setf(error, API_ERROR_INVALID_NAME, "'%.64s' is not a valid name: up to 64 letters, "
                                      "digits, '.', '_' and '-'.", name);
        if (r >= 0)
                r = task_check(image, argv, options, &opts, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r >= 0 && find(m, name, error)) {
                sd_bus_error_free(error);
                r = sd_bus_error_setf(error, API_ERROR_NAME_TAKEN, "A sandbox named '%s' exists already.", name);
        } else if (r >= 0)
                sd_bus_error_free(error);
        if (r >= 0 && asprintf(&snapshot, SANDBOX_PREFIX "%s", name) < 0)
                r = -ENOMEM;
        if (r >= 0) {
                b = calloc(1, sizeof *b);
                r = b ? 0 : -ENOMEM;
        }
        if (r >= 0) {
                b->name = strdup(name);
                b->image = strdup(image);
                b->state = strdup("created");
                b->command = json_array();
                for (char **a = argv; a && *a; a++)
                        json_array_append_new(b->command, json_string(*a));
                b->options = json_incref(opts);
                /* Listed on disk before its snapshot is made: a crash in
                 * between leaves a sandbox without a snapshot, which
                 * DeleteSandbox removes, never a snapshot under a name
                 * kept for sandboxes that no sandbox names and no call
                 * may delete. */
                b->next = m->sandboxes;
                m->sandboxes = b;
                r = save(m);
                if (r < 0) {
                        unlist(m, b);
                        b = NULL;
                }
        }
        if (r >= 0) {
                r = store_subvolume_snapshot(m->store, image, snapshot, false);
                if (r == -ENOENT)
                        r = store_error_reply(r, image, error);
                else if (r < 0)
                        r = store_error_reply(r, snapshot, error);
        }
        /* Its runs share one snapshot: the limit is on their growth
         * together, from the image. */
        if (r >= 0 && api_option_uint(opts, "disk_max", 0) > 0) {
                r = sandbox_limit_growth(m->store, snapshot, api_option_uint(opts, "disk_max", 0));
                if (r < 0) {
                        (void) store_subvolume_delete(m->store, snapshot, NULL);
                        r = store_error_reply(r, snapshot, error);
                }
        }
        if (r < 0 && b) {
                unlist(m, b);
                (void) save(m);
        }
        if (r >= 0) {
                (void) manager_signal_subvolume(m, snapshot, true);
                signal_sandbox(m, name, true);
                doc = sandbox_to_json(b, true);
                r = api_reply_json(message, doc);
        }
        for (char **a = argv; a && *a; a++)
                free(*a);
        free(argv);
        return r;
}

static int do_start(sd_bus_message *message, Manager *m, const char *name, sd_bus_error *error) {
        _cleanup_free_ char *snapshot = NULL;
        _cleanup_free_ char **argv = NULL;
        Sandbox *b;
        Job *j = NULL;
        size_t n, i;
        json_t *v;
        int r;

        b = find(m, name, error);
        if (!b)
                return -ENOENT;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        if (streq(b->state, "running"))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Sandbox '%s' is running already.", name);
        if (b->delete_call)
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Sandbox '%s' is being deleted.", name);
        n = json_array_size(b->command);
        argv = calloc(n + 1, sizeof *argv);
        if (!argv || asprintf(&snapshot, SANDBOX_PREFIX "%s", name) < 0)
                return -ENOMEM;
        json_array_foreach(b->command, i, v)
                argv[i] = (char *) json_string_value(v);
        r = task_start(m, snapshot, argv, b->options, true, &j);
        if (r >= 0) {
                b->job = j->id;
                (void) set_state(b, "running");
                (void) save(m);
        }
        return reply_job(message, m, r, j, error);
}

/* How many calls of sender (a unique name) wait. */
static unsigned waiters_of(const Sandbox *b, const char *sender) {
        unsigned n = 0;

        for (size_t i = 0; sender && i < b->n_waiters; i++) {
                const char *s = sd_bus_message_get_sender(b->waiters[i].message);

                if (s && streq(s, sender))
                        n++;
        }
        return n;
}

/* How many calls of unprivileged callers wait: all, or those of uid. */
static unsigned unprivileged_waiters(const Sandbox *b, bool of_uid, uid_t uid) {
        unsigned n = 0;

        for (size_t i = 0; i < b->n_waiters; i++)
                if (b->waiters[i].unprivileged && (!of_uid || b->waiters[i].uid == uid))
                        n++;
        return n;
}

/* Whether a caller may wait once more; otherwise sets the error. */
static int check_waiter_limits(const Sandbox *b, const char *sender, uid_t uid, bool unprivileged,
                               sd_bus_error *error) {
        if (b->n_waiters == WAITERS_MAX ||
            (unprivileged && unprivileged_waiters(b, false, 0) >= WAITERS_UNPRIVILEGED_MAX))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Too many callers wait for sandbox '%s'.",
                                         b->name);
        if (waiters_of(b, sender) >= WAITERS_PER_CALLER ||
            (unprivileged && unprivileged_waiters(b, true, uid) >= WAITERS_PER_CALLER))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "You wait for sandbox '%s' %d times already; wait "
                                         "for the replies first.", b->name, WAITERS_PER_CALLER);
        return 0;
}

static int do_wait(sd_bus_message *message, Manager *m, const char *name, sd_bus_error *error) {
        _cleanup_(sd_bus_error_free) sd_bus_error refusal = SD_BUS_ERROR_NULL;
        _cleanup_json_ json_t *doc = NULL;
        const char *sender = sd_bus_message_get_sender(message);
        SandboxWaiter *w;
        Sandbox *b;
        bool may_change;
        uid_t uid;
        int r;

        b = find(m, name, error);
        if (!b)
                return -ENOENT;
        if (!streq(b->state, "running")) {
                doc = sandbox_to_json(b, caller_sees_output(message));
                return api_reply_json(message, doc);
        }
        r = manager_caller_identity(message, &uid, &may_change);
        if (r < 0)
                return r;
        /* The places of callers that left are given up first. */
        if (check_waiter_limits(b, sender, uid, !may_change, &refusal) < 0)
                prune_waiters(b);
        r = check_waiter_limits(b, sender, uid, !may_change, error);
        if (r < 0)
                return r;
        /* The reply goes when the task ends. */
        w = &b->waiters[b->n_waiters];
        r = sd_bus_track_new(sd_bus_message_get_bus(message), &w->caller, NULL, NULL);
        if (r >= 0)
                r = sd_bus_track_add_sender(w->caller, message);
        if (r < 0) {
                w->caller = sd_bus_track_unref(w->caller);
                return r;
        }
        w->message = sd_bus_message_ref(message);
        w->uid = uid;
        w->unprivileged = !may_change;
        b->n_waiters++;
        return 1;
}

static int do_kill(sd_bus_message *message, Manager *m, const char *name, sd_bus_error *error) {
        Sandbox *b;
        Job *j;
        int r;

        b = find(m, name, error);
        if (!b)
                return -ENOENT;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        j = streq(b->state, "running") ? manager_find_job(m, b->job) : NULL;
        if (!j || job_cancel(j) < 0)
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Sandbox '%s' is not running.", name);
        return sd_bus_reply_method_return(message, NULL);
}

/* had_snapshot: false for a sandbox listed by a daemon that died before it
 * made the snapshot, which no signal announced: none says it went. */
static void sandbox_remove(Manager *m, Sandbox *b, bool had_snapshot) {
        _cleanup_free_ char *snapshot = NULL;

        if (had_snapshot && asprintf(&snapshot, SANDBOX_PREFIX "%s", b->name) >= 0)
                (void) manager_signal_subvolume(m, snapshot, false);
        signal_sandbox(m, b->name, false);
        for (Sandbox **p = &m->sandboxes; *p; p = &(*p)->next)
                if (*p == b) {
                        *p = b->next;
                        break;
                }
        sandbox_free(b);
        (void) save(m);
        manager_reap_soon(m);
}

/* Deletes the sandbox's snapshot and the sandbox: 1 when done, 2 when
 * there was no snapshot, 0 while a holder keeps the snapshot, or a
 * negative errno. */
static int try_delete(Manager *m, Sandbox *b) {
        _cleanup_free_ char *snapshot = NULL;
        int r;

        if (asprintf(&snapshot, SANDBOX_PREFIX "%s", b->name) < 0)
                return -ENOMEM;
        r = store_subvolume_delete(m->store, snapshot, NULL);
        if (r == -EBUSY)
                return 0;
        if (r == -ENOENT)
                return 2;
        return r < 0 ? r : 1;
}

static int reply_delete(sd_bus_message *call, const char *name, int r) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_free_ char *snapshot = NULL;

        if (r > 0)
                return sd_bus_reply_method_return(call, NULL);
        if (r == 0)
                r = -EBUSY;
        if (asprintf(&snapshot, SANDBOX_PREFIX "%s", name) < 0)
                return sd_bus_reply_method_errno(call, ENOMEM, NULL);
        r = store_error_reply(r, snapshot, &error);
        return sd_bus_error_is_set(&error) ? sd_bus_reply_method_error(call, &error)
                                           : sd_bus_reply_method_errno(call, -r, NULL);
}

static int on_delete_retry(sd_event_source *s, uint64_t usec, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL;
        _cleanup_free_ char *name = NULL;
        Sandbox *b = userdata;
        Manager *m = b->manager;
        int r;

        r = try_delete(m, b);
        if (r == 0 && ++b->delete_tries < DELETE_RETRIES) {
                r = sd_event_source_set_time_relative(s, DELETE_RETRY_USEC);
                if (r >= 0)
                        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        }
        call = TAKE_PTR(b->delete_call);
        b->delete_retry = sd_event_source_disable_unref(b->delete_retry);
        name = strdup(b->name);
        if (r > 0)
                sandbox_remove(m, b, r == 1);
        return name ? reply_delete(call, name, r) : sd_bus_reply_method_errno(call, ENOMEM, NULL);
}

static int do_delete(sd_bus_message *message, Manager *m, const char *name, sd_bus_error *error) {
        Sandbox *b;
        int r;

        b = find(m, name, error);
        if (!b)
                return -ENOENT;
        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        if (streq(b->state, "running"))
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Sandbox '%s' is running: kill it first.", name);
        if (b->delete_call)
                return sd_bus_error_setf(error, API_ERROR_BUSY, "Sandbox '%s' is being deleted.", name);
        r = try_delete(m, b);
        if (r > 0) {
                sandbox_remove(m, b, r == 1);
                return sd_bus_reply_method_return(message, NULL);
        }
        if (r < 0)
                return reply_delete(message, name, r);
        /* A task that died with a daemon may still be on its way out, its
         * snapshot's server with it: try again for a while, answering
         * other calls meanwhile. */
        b->manager = m;
        b->delete_tries = 0;
        r = sd_event_add_time_relative(m->event, &b->delete_retry, CLOCK_MONOTONIC, DELETE_RETRY_USEC, 0,
                                       on_delete_retry, b);
        if (r < 0)
                return r;
        b->delete_call = sd_bus_message_ref(message);
        return 1;
}

int method_list_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *list = json_array();
        Manager *m = userdata;

        bool with_output = caller_sees_output(message);

        for (Sandbox *b = m->sandboxes; b; b = b->next)
                json_array_append_new(list, sandbox_to_json(b, with_output));
        return api_reply_json(message, list);
}

/* ---- the objects: /org/cowbox1/sandbox/NAME ---- */

static Sandbox *from_path(Manager *m, const char *path) {
        _cleanup_free_ char *name = NULL;

        if (sd_bus_path_decode(path, API_SANDBOX_PREFIX, &name) <= 0)
                return NULL;
        for (Sandbox *b = m->sandboxes; b; b = b->next)
                if (streq(b->name, name))
                        return b;
        return NULL;
}

int sandbox_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                        void **found, sd_bus_error *error) {
        if (!from_path(userdata, path))
                return 0;
        *found = userdata;
        return 1;
}

int sandbox_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        Manager *m = userdata;
        size_t n = 0, k = 0;
        char **list;

        for (Sandbox *b = m->sandboxes; b; b = b->next)
                n++;
        list = calloc(n + 1, sizeof *list);
        if (!list)
                return -ENOMEM;
        for (Sandbox *b = m->sandboxes; b; b = b->next)
                if (sd_bus_path_encode(API_SANDBOX_PREFIX, b->name, &list[k]) >= 0)
                        k++;
        *nodes = list;
        return 0;
}

static int sandbox_property(sd_bus *bus, const char *path, const char *interface, const char *property,
                            sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Sandbox *b = from_path(userdata, path);
        _cleanup_free_ char *text = NULL;
        sd_bus_message *call;

        if (!b)
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_SANDBOX, "The sandbox is gone.");
        if (streq(property, "Name"))
                return sd_bus_message_append(reply, "s", b->name);
        if (streq(property, "Image"))
                return sd_bus_message_append(reply, "s", b->image);
        if (streq(property, "State"))
                return sd_bus_message_append(reply, "s", b->state);
        /* Read for a Get, GetAll or GetManagedObjects call, or for a
         * signal (InterfacesAdded), sent to everyone. */
        call = sd_bus_get_current_message(bus);
        text = sandbox_text(b, call &&
                               (sd_bus_message_is_method_call(call, "org.freedesktop.DBus.Properties", NULL) > 0 ||
                                sd_bus_message_is_method_call(call, "org.freedesktop.DBus.ObjectManager", NULL) > 0) &&
                               caller_sees_output(call));
        return text ? sd_bus_message_append(reply, "s", text) : -ENOMEM;
}


#define NAME_METHOD(verb)                                                                      \
        int method_##verb##_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                const char *name;                                                              \
                int r = sd_bus_message_read(message, "s", &name);                              \
                return r < 0 ? r : do_##verb(message, userdata, name, error);                   \
        }                                                                                      \
        static int object_##verb(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                Sandbox *b = from_path(userdata, sd_bus_message_get_path(message));             \
                if (!b)                                                                        \
                        return sd_bus_error_setf(error, API_ERROR_NO_SUCH_SANDBOX, "The sandbox is gone."); \
                return do_##verb(message, userdata, b->name, error);                            \
        }
NAME_METHOD(start)
NAME_METHOD(wait)
NAME_METHOD(kill)
NAME_METHOD(delete)

const sd_bus_vtable sandbox_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Name", "s", sandbox_property, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Image", "s", sandbox_property, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("State", "s", sandbox_property, 0, 0),
        SD_BUS_PROPERTY("Json", "s", sandbox_property, 0, 0),
        SD_BUS_METHOD_WITH_ARGS("Start", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", job_id, "o", job_path), object_start,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Wait", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", sandbox_json), object_wait,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Kill", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, object_kill, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Delete", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, object_delete,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END
};
