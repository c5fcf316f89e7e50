/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "fd-util.h"
#include "process-util.h"
#include "string-util.h"
#include "state-file.h"
#include "time-util.h"
#include "workspace.h"

#define LABEL_MAX 64

static uint64_t now_usec(void) {
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

/* Names and labels: letters, digits, '.', '_' and '-', not starting with
 * '.' or '-', so that they make safe subvolume names and paths. */
bool workspace_name_is_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;

        if (n == 0 || n > LABEL_MAX || name[0] == '.' || name[0] == '-')
                return false;
        for (const char *p = name; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                      *p == '.' || *p == '_' || *p == '-'))
                        return false;
        return true;
}

int workspace_subvolume(const char *name, const char *label, char **ret) {
        if (asprintf(ret, WORKSPACE_PREFIX "%s%s%s", name, label ? WORKSPACE_CHECKPOINT_SEPARATOR : "",
                     label ? label : "") < 0)
                return -ENOMEM;
        return 0;
}

static Workspace *workspace_free(Workspace *ws) {
        if (!ws)
                return NULL;
        free(ws->name);
        free(ws->image);
        free(ws->path);
        free(ws);
        return NULL;
}

Workspace *workspace_find(const Workspaces *w, const char *name) {
        for (Workspace *ws = w->list; ws; ws = ws->next)
                if (streq(ws->name, name))
                        return ws;
        return NULL;
}

Workspace *workspace_find_by_subvolume(const Workspaces *w, const char *subvolume, bool or_checkpoint) {
        const char *name, *label;
        size_t n;

        if (!startswith(subvolume, WORKSPACE_PREFIX))
                return NULL;
        name = subvolume + strlen(WORKSPACE_PREFIX);
        n = strlen(name);
        label = or_checkpoint ? strstr(name, WORKSPACE_CHECKPOINT_SEPARATOR) : NULL;
        if (label)
                n = (size_t) (label - name);
        /* A restore's new state is the workspace's own: other calls are
         * answered while the restore waits for the old state's server, and
         * one that deleted, renamed or froze it then would leave the
         * workspace with no state, or a read-only one. */
        else if (endswith(name, WORKSPACE_RESTORING_SUFFIX))
                n -= strlen(WORKSPACE_RESTORING_SUFFIX);
        for (Workspace *ws = w->list; ws; ws = ws->next)
                if (strncmp(ws->name, name, n) == 0 && !ws->name[n])
                        return ws;
        return NULL;
}

void workspaces_done(Workspaces *w) {
        while (w->list) {
                Workspace *next = w->list->next;

                workspace_free(w->list);
                w->list = next;
        }
        free(w->state_file);
        free(w->default_base);
}

/* ---- the list on disk ---- */

/* A default mount point saved by a daemon that was given the store's path
 * through a symbolic link (before it made the path absolute): the same
 * directory, named as the mount point checks need it, without the link.
 * Only the store's own directory of workspaces is looked through: a link
 * on a path of the owner's choosing must stay refused. */
static char *default_path_migrated(const Workspaces *w, const char *name, const char *path, bool *migrated) {
        _cleanup_free_ char *dir = strdup(path), *resolved = NULL, *base = NULL, *wanted = NULL;
        char *slash = dir ? strrchr(dir, '/') : NULL;

        if (!slash || !streq(slash + 1, name) || asprintf(&wanted, "%s/%s", w->default_base, name) < 0 ||
            streq(path, wanted))
                return strdup(path);
        *slash = 0;
        resolved = realpath(dir, NULL);
        base = realpath(w->default_base, NULL);
        if (!resolved || !base || !streq(resolved, base))
                return strdup(path);
        *migrated = true;
        return TAKE_PTR(wanted);
}

int workspaces_load(Workspaces *w, const char *store_path, char **ret_error) {
        json_t *doc, *array, *v;
        bool migrated = false;
        size_t i;
        int r;

        *w = (Workspaces) {};
        if (asprintf(&w->default_base, "%s-workspaces", store_path) < 0 ||
            asprintf(&w->state_file, "%s/.workspaces.json", w->default_base) < 0)
                return -ENOMEM;
        if (mkdir(w->default_base, 0755) < 0 && errno != EEXIST)
                return -errno;

        r = state_file_load(w->state_file, "workspaces", 0, &doc, ret_error);
        if (r < 0 || !doc)
                return r;
        array = json_object_get(doc, "workspaces");
        if (!json_is_array(array)) {
                json_decref(doc);
                if (asprintf(ret_error, "the list of workspaces %s is damaged: it holds no \"workspaces\" "
                             "array; repair it, or move it aside to start with none", w->state_file) < 0)
                        *ret_error = NULL;
                return -EUCLEAN;
        }
        json_array_foreach(array, i, v) {
                Workspace *ws = calloc(1, sizeof *ws);
                const char *name = json_string_value(json_object_get(v, "name"));
                const char *image = json_string_value(json_object_get(v, "image"));
                const char *path = json_string_value(json_object_get(v, "path"));

                if (!ws || !name || !image || !path || !workspace_name_is_valid(name)) {
                        free(ws);
                        continue;
                }
                ws->name = strdup(name);
                ws->image = strdup(image);
                ws->path = default_path_migrated(w, name, path, &migrated);
                ws->owner = (uid_t) json_integer_value(json_object_get(v, "owner"));
                ws->group = (gid_t) json_integer_value(json_object_get(v, "group"));
                ws->limit = (uint64_t) json_integer_value(json_object_get(v, "limit"));
                ws->created_usec = (uint64_t) json_integer_value(json_object_get(v, "created_usec"));
                if (!ws->name || !ws->image || !ws->path) {
                        workspace_free(ws);
                        json_decref(doc);
                        return -ENOMEM;
                }
                ws->next = w->list;
                w->list = ws;
        }
        json_decref(doc);
        /* Tried again at the next change if it fails now. */
        if (migrated)
                (void) workspaces_save(w);
        return 0;
}

/* Written to a temporary file, synced and renamed over the old one: the
 * list is the old or the new one after a crash, never half of either. */
int workspaces_save(const Workspaces *w) {
        json_t *array = json_array(), *doc;
        int r;

        if (!array)
                return -ENOMEM;
        /* A workspace left out would be forgotten at the next start. */
        for (Workspace *ws = w->list; ws; ws = ws->next)
                if (json_array_append_new(array, json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I}",
                                                           "name", ws->name, "image", ws->image, "path", ws->path,
                                                           "owner", (json_int_t) ws->owner,
                                                           "group", (json_int_t) ws->group,
                                                           "limit", (json_int_t) ws->limit,
                                                           "created_usec", (json_int_t) ws->created_usec)) < 0) {
                        json_decref(array);
                        return -EINVAL;
                }
        doc = json_pack("{s:o}", "workspaces", array);
        if (!doc)
                return -ENOMEM;
        r = state_file_save(w->state_file, doc);
        json_decref(doc);
        return r;
}

/* ---- mounting ---- */

static bool path_is_mount_point(const char *path) {
        _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
        char line[4096];

        if (!f)
                return false;
        while (fgets(line, sizeof line, f)) {
                char mountpoint[4096];

                if (sscanf(line, "%*s %*s %*s %*s %4095s", mountpoint) != 1)
                        continue;
                mountinfo_unescape(mountpoint);
                if (streq(mountpoint, path))
                        return true;
        }
        return false;
}

bool workspace_is_mounted(const Workspace *ws) {
        return path_is_mount_point(ws->path);
}

static pid_t subvolume_holder(const Workspace *ws, Store *s) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};
        pid_t holder;

        if (workspace_subvolume(ws->name, NULL, &subvolume) < 0 || store_subvolume_show(s, subvolume, &info) < 0)
                return 0;
        holder = info.mounted_by;
        store_subvolume_info_clear(&info);
        return holder;
}

WorkspaceServer workspace_server(const Workspace *ws, Store *s) {
        pid_t holder = subvolume_holder(ws, s);

        if (workspace_is_mounted(ws))
                return holder > 0 ? WORKSPACE_SERVED : WORKSPACE_NOT_SERVED;
        return holder > 0 && !process_is_exiting(holder) ? WORKSPACE_HELD_ELSEWHERE : WORKSPACE_NOT_SERVED;
}

/* Whether path is dir or lies below it. */
static bool path_is_within(const char *path, const char *dir) {
        size_t n = strlen(dir);

        while (n > 0 && dir[n - 1] == '/')
                n--;
        return strncmp(path, dir, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* Whether path is another workspace's mount point, or lies in or around
 * one: two mounts there would replace each other's. */
bool workspace_path_is_taken(const Workspaces *w, const char *path) {
        for (const Workspace *ws = w->list; ws; ws = ws->next)
                if (path_is_within(path, ws->path) || path_is_within(ws->path, path))
                        return true;
        return false;
}

static bool path_components_are_plain(const char *path) {
        for (const char *p = path + 1;;) {
                size_t n = strcspn(p, "/");

                if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
                        return false;
                if (!p[n])
                        return true;
                p += n + 1;
        }
}

static bool dir_is_empty(const char *path) {
        _cleanup_closedir_ DIR *d = opendir(path);
        struct dirent *de;

        if (!d)
                return false;
        while ((de = readdir(d)))
                if (!streq_dot(de->d_name))
                        return false;
        return true;
}

int workspace_check_path(const Workspaces *w, const char *store_path, const char *name, const char *path,
                         char **ret, const char **ret_reason) {
        _cleanup_free_ char *parent = NULL, *real_parent = NULL, *store = NULL, *resolved = NULL, *defaults = NULL,
                *own = NULL;
        const char *base;
        json_t *valid;
        struct stat st;

        if (path[0] != '/' || strlen(path) > 1024 || streq(path, "/")) {
                *ret_reason = "must be an absolute path of at most 1024 bytes, not '/'";
                return -EINVAL;
        }
        if (!path_components_are_plain(path)) {
                *ret_reason = "must not hold '.', '..', '//' or end in '/'";
                return -EINVAL;
        }
        base = strrchr(path, '/') + 1;
        parent = strndup(path, (size_t) (base - path));
        if (!parent)
                return -ENOMEM;
        real_parent = realpath(parent, NULL);
        if (!real_parent || stat(real_parent, &st) < 0 || !S_ISDIR(st.st_mode)) {
                *ret_reason = "must be in a directory that exists";
                return -EINVAL;
        }
        if (asprintf(&resolved, "%s%s%s", real_parent, streq(real_parent, "/") ? "" : "/", base) < 0)
                return -ENOMEM;
        /* The list on disk and every answer are JSON: UTF-8 only. */
        valid = json_string(resolved);
        if (!valid) {
                *ret_reason = "must resolve to a name that is valid UTF-8";
                return -EINVAL;
        }
        json_decref(valid);
        store = realpath(store_path, NULL);
        if (!store)
                return -errno;

        /* The store, its sandboxes and where workspaces go by default:
         * nothing may be mounted over them or in the first two. */
        FOREACH_STRING(suffix, "", "-sandboxes", "-workspaces") {
                _cleanup_free_ char *dir = NULL;

                if (asprintf(&dir, "%s%s", store, suffix) < 0)
                        return -ENOMEM;
                if (path_is_within(dir, resolved) || (!streq(suffix, "-workspaces") && path_is_within(resolved, dir))) {
                        *ret_reason = "must lie outside the store and its directories";
                        return -EINVAL;
                }
        }
        if (workspace_path_is_taken(w, resolved)) {
                *ret_reason = "must lie outside every other workspace";
                return -EINVAL;
        }
        /* In the default directory, a workspace may only take its own
         * default place: any other is another workspace's default, now or
         * when one of that name is made, or the daemon's own files. */
        if (asprintf(&defaults, "%s-workspaces", store) < 0 || asprintf(&own, "%s/%s", defaults, name) < 0)
                return -ENOMEM;
        if (path_is_within(resolved, defaults) && !streq(resolved, own)) {
                *ret_reason = "may lie in the default directory of workspaces only as the workspace's own, "
                              "where it goes without a path";
                return -EINVAL;
        }
        if (path_is_mount_point(resolved)) {
                *ret_reason = "is a mount point already";
                return -EINVAL;
        }
        if (lstat(resolved, &st) >= 0 && (!S_ISDIR(st.st_mode) || !dir_is_empty(resolved))) {
                *ret_reason = "exists and is not an empty directory";
                return -EINVAL;
        }
        *ret = TAKE_PTR(resolved);
        return 0;
}

/* The server: a process of its own (its own session, none of the daemon's
 * file descriptors), so that it outlives a restart of the daemon and the
 * developer's editors never notice one. Like every mount of the store, it
 * writes through: a developer's write() itself reports the limit (EDQUOT)
 * or a full disk (ENOSPC), and what an editor saw written is what is
 * stored. */
_noreturn_
static void mount_server(const Workspace *ws, const char *store_path, const char *subvolume, int ready_fd) {
        StoreMountOptions opts = {
                .ready_fd = 3,
                .nofollow = true,
                .map_root = ws->owner != 0,
                .root_uid = ws->owner,
                .root_gid = ws->group,
        };
        Store *s = NULL;

        if (dup2(ready_fd, 3) < 0 || close_range(4, ~0U, 0) < 0)
                _exit(EXIT_FAILURE);
        if (store_open(store_path, &s) < 0)
                _exit(EXIT_FAILURE);
        _exit(store_mount(s, subvolume, ws->path, &opts, NULL) < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
}

int workspace_mount_ready(int fd) {
        char buf[4];
        ssize_t k = read(fd, buf, sizeof buf);

        if (k < 0)
                return -errno;
        return k > 0 && buf[0] == '1' ? 0 : -EIO;
}

/* The mount point is checked again before every mount, not only when the
 * workspace was made: its owner may change the directory it lies in, and
 * while it is not mounted (during a restore, across a restart) could swap
 * it, or a directory above it, for a symbolic link to a directory of
 * theirs or of the system. It must be reached through directories only,
 * and be a directory of root (we made it) or of the owner; -ELOOP if not.
 * Made if missing, in the directory checked. The server then walks the
 * path the same way and mounts on what it opened. */
static int check_mount_point(const Workspace *ws) {
        _cleanup_free_ char *parent = NULL;
        _cleanup_close_ int parent_fd = -EBADF, fd = -EBADF;
        const char *base = strrchr(ws->path, '/');
        struct stat st;

        if (ws->path[0] != '/' || !base || !base[1])
                return -ELOOP;
        parent = strndup(ws->path, MAX((size_t) (base - ws->path), (size_t) 1));
        if (!parent)
                return -ENOMEM;
        base++;
        parent_fd = open_dir_nofollow(parent);
        if (parent_fd == -ENOTDIR || parent_fd == -ELOOP)
                return -ELOOP;
        if (parent_fd < 0)
                return parent_fd;
        if (mkdirat(parent_fd, base, 0755) < 0 && errno != EEXIST)
                return -errno;
        fd = openat(parent_fd, base, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOTDIR || errno == ELOOP ? -ELOOP : -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (st.st_uid != 0 && st.st_uid != ws->owner)
                return -ELOOP;
        return 0;
}

/* A restore switches the workspace over to its new state in two commits,
 * the old state deleted, then the new one renamed: a crash in between
 * leaves the new state under its temporary name and none under the
 * workspace's. The switch is finished before the workspace is served.
 * A crash before the old state was deleted leaves both: that restore
 * never happened, and its new state goes. Nobody else may delete it (it
 * is the workspace's), and it would keep the checkpoint's layers. None
 * is mounted while a restore waits to switch over. */
static int finish_restore(Store *s, const char *subvolume) {
        _cleanup_free_ char *incoming = NULL;
        int r;

        if (asprintf(&incoming, "%s" WORKSPACE_RESTORING_SUFFIX, subvolume) < 0)
                return -ENOMEM;
        r = store_subvolume_exists(s, subvolume);
        if (r < 0)
                return r;
        if (r > 0) {
                (void) store_subvolume_delete(s, incoming, NULL);
                return 0;
        }
        r = store_subvolume_rename(s, incoming, subvolume);
        return r == -ENOENT ? 0 : r;
}

int workspace_mount_start(Workspace *ws, Store *s, const char *store_path, int *ret_ready_fd) {
        _cleanup_free_ char *subvolume = NULL;
        _cleanup_close_ int rfd = -EBADF;
        int fds[2], status, r;
        pid_t pid;

        *ret_ready_fd = -EBADF;
        r = workspace_subvolume(ws->name, NULL, &subvolume);
        if (r < 0)
                return r;
        /* Also for one still served, as after a restart of the daemon: a
         * restore that died before it switched leaves it served. */
        r = finish_restore(s, subvolume);
        if (workspace_is_mounted(ws)) {
                if (workspace_server(ws, s) == WORKSPACE_SERVED)
                        return 0;
                /* Its server is gone: clear the dead mount, serve it anew. */
                (void) umount2(ws->path, MNT_DETACH | UMOUNT_NOFOLLOW);
        }
        if (r < 0)
                return r;
        /* Nothing to serve (a crash before its subvolume was made, which
         * RemoveWorkspace clears): said now, not by a server started only
         * to fail, while the workspace would be busy being mounted. */
        r = store_subvolume_exists(s, subvolume);
        if (r <= 0)
                return ws->mount_error = r < 0 ? r : -ENOENT;
        r = ws->mount_error = check_mount_point(ws);
        if (r < 0)
                return r;
        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        rfd = fds[0];

        pid = fork();
        if (pid < 0) {
                close(fds[1]);
                return -errno;
        }
        if (pid == 0) {
                sigset_t none;

                store_close_inherited(); /* the server opens its own */
                sigemptyset(&none);
                (void) sigprocmask(SIG_SETMASK, &none, NULL);
                (void) setsid();
                if (fork() == 0)
                        mount_server(ws, store_path, subvolume, fds[1]);
                _exit(EXIT_SUCCESS);
        }
        close(fds[1]);
        (void) waitpid(pid, &status, 0);
        *ret_ready_fd = TAKE_FD(rfd);
        return 0;
}

int workspace_mount(Workspace *ws, Store *s, const char *store_path) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        r = workspace_mount_start(ws, s, store_path, &fd);
        if (r < 0 || fd < 0)
                return r;
        r = fd_wait_readable(fd, WORKSPACE_MOUNT_TIMEOUT_USEC / 1000);
        if (r <= 0)
                return r == 0 ? -ETIMEDOUT : r;
        return workspace_mount_ready(fd);
}

int workspace_released(const Workspace *ws, Store *s) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};
        pid_t holder;
        int r;

        r = workspace_subvolume(ws->name, NULL, &subvolume);
        if (r < 0)
                return r;
        r = store_subvolume_show(s, subvolume, &info);
        holder = info.mounted_by;
        store_subvolume_info_clear(&info);
        if (r == -ENOENT)
                return 1;       /* gone: nobody holds it */
        if (r < 0)
                return r;
        return holder == 0;
}

int workspace_wait_released(const Workspace *ws, Store *s, uint64_t deadline_usec) {
        for (;;) {
                int r = workspace_released(ws, s);

                if (r != 0)
                        return r < 0 ? r : 0;
                if (monotonic_usec() >= deadline_usec)
                        return -ETIME;
                (void) usleep(WORKSPACE_RELEASE_POLL_USEC);
        }
}

int workspace_unmount_start(const Workspace *ws, Store *s) {
        WorkspaceServer server = workspace_server(ws, s);

        if (server == WORKSPACE_HELD_ELSEWHERE)
                /* Not its server: someone mounted the subvolume elsewhere,
                 * and will not let go because we wait. */
                return -EBUSY;
        if (workspace_is_mounted(ws) && umount2(ws->path, UMOUNT_NOFOLLOW) < 0) {
                if (errno != EBUSY)
                        return -errno;
                /* A dead server's mount is busy only for the kernel. */
                if (server == WORKSPACE_SERVED)
                        return -EBUSY;
                (void) umount2(ws->path, MNT_DETACH);
        }
        return 0;
}

int workspace_unmount(const Workspace *ws, Store *s) {
        int r;

        r = workspace_unmount_start(ws, s);
        if (r < 0)
                return r;
        return workspace_wait_released(ws, s, monotonic_usec() + WORKSPACE_RELEASE_TIMEOUT_USEC);
}

/* ---- the work ---- */

static int give_root_to(Store *s, const char *subvolume, uid_t owner, gid_t group) {
        struct stat attr = { .st_uid = owner, .st_gid = group, .st_mode = 0700 }, st;
        Volume *v = NULL;
        int r;

        r = volume_open(s, subvolume, true, &v, NULL);
        if (r < 0)
                return r;
        r = volume_setattr(v, VOLUME_ROOT_INO, &attr, VOLUME_SET_UID | VOLUME_SET_GID | VOLUME_SET_MODE, &st);
        if (r >= 0)
                r = volume_sync(v);
        volume_close(v);
        return r;
}

/* Out of the list (saved) and, if it was made, its subvolume deleted: as
 * if it had never been asked for. */
static void create_undo(Workspaces *w, Store *s, Workspace *ws, bool made) {
        _cleanup_free_ char *subvolume = NULL;

        for (Workspace **p = &w->list; *p; p = &(*p)->next)
                if (*p == ws) {
                        *p = ws->next;
                        break;
                }
        (void) workspaces_save(w);
        if (made && workspace_subvolume(ws->name, NULL, &subvolume) >= 0) {
                (void) workspace_unmount(ws, s);
                (void) store_subvolume_delete(s, subvolume, NULL);
        }
        workspace_free(ws);
}

int workspace_create(Workspaces *w, Store *s, const char *name, const char *image,
                     uid_t owner, gid_t group, uint64_t limit, const char *path) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};
        Workspace *ws;
        bool made = false;
        int r;

        if (!workspace_name_is_valid(name))
                return -EINVAL;
        if (workspace_find(w, name))
                return -EEXIST;
        r = store_subvolume_show(s, image, &info);
        if (r >= 0 && !info.readonly)
                r = -EROFS;
        store_subvolume_info_clear(&info);
        if (r < 0)
                return r;
        r = workspace_subvolume(name, NULL, &subvolume);
        if (r < 0)
                return r;

        ws = calloc(1, sizeof *ws);
        if (!ws)
                return -ENOMEM;
        ws->name = strdup(name);
        ws->image = strdup(image);
        if (path)
                ws->path = strdup(path);
        else if (asprintf(&ws->path, "%s/%s", w->default_base, name) < 0)
                ws->path = NULL;
        ws->owner = owner;
        ws->group = group;
        ws->limit = limit;
        ws->created_usec = now_usec();
        if (!ws->name || !ws->image || !ws->path) {
                workspace_free(ws);
                return -ENOMEM;
        }
        /* Also the default place: another workspace may have been given
         * it, or a path around it, before that was refused. */
        if (workspace_path_is_taken(w, ws->path)) {
                workspace_free(ws);
                return -EADDRINUSE;
        }

        /* Listed on disk before its subvolume is made: a crash in between
         * leaves a workspace without a subvolume, which RemoveWorkspace
         * removes, never a subvolume under a name kept for workspaces
         * that no workspace names and no call may delete. */
        ws->next = w->list;
        w->list = ws;
        r = workspaces_save(w);
        if (r >= 0) {
                r = store_subvolume_snapshot(s, image, subvolume, false);
                made = r >= 0;
        }
        if (r >= 0)
                r = give_root_to(s, subvolume, owner, group);
        /* Also without a limit: a snapshot keeps the image's quota. */
        if (r >= 0)
                r = store_subvolume_set_quota(s, subvolume, limit);
        if (r < 0)
                create_undo(w, s, ws, made);
        return r;
}

int workspace_create_undo(Workspaces *w, Store *s, const char *name) {
        Workspace *ws = workspace_find(w, name);

        if (!ws)
                return -ENOENT;
        create_undo(w, s, ws, true);
        return 0;
}

/* The names of the workspace's checkpoints' subvolumes (prefix "workspace-NAME@"). */
static int list_checkpoints(const Workspace *ws, Store *s, StoreSubvolumeInfo **ret, size_t *ret_n) {
        _cleanup_free_ char *prefix = NULL;
        StoreSubvolumeInfo *infos = NULL;
        size_t n = 0, k = 0;
        int r;

        r = workspace_subvolume(ws->name, "", &prefix);
        if (r < 0)
                return r;
        r = store_subvolume_list(s, &infos, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                if (startswith(infos[i].name, prefix)) {
                        StoreSubvolumeInfo keep = infos[i];

                        infos[i] = infos[k];
                        infos[k++] = keep;
                }
        }
        for (size_t i = k; i < n; i++)
                store_subvolume_info_clear(&infos[i]);
        *ret = infos;
        *ret_n = k;
        return 0;
}

int workspace_remove_unmounted(Workspaces *w, Store *s, const char *name) {
        _cleanup_free_ char *subvolume = NULL, *incoming = NULL;
        StoreSubvolumeInfo *checkpoints = NULL;
        Workspace *ws = workspace_find(w, name);
        size_t n = 0;
        int r;

        if (!ws)
                return -ENOENT;
        r = workspace_subvolume(name, NULL, &subvolume);
        if (r >= 0 && asprintf(&incoming, "%s" WORKSPACE_RESTORING_SUFFIX, subvolume) < 0)
                r = -ENOMEM;
        if (r < 0)
                return r;
        /* Deleted before the list is saved: on a full disk, the deletion
         * is what makes room for the save. */
        r = store_subvolume_delete(s, subvolume, NULL);
        if (r < 0 && r != -ENOENT)
                return r;
        /* A restore cut short before it deleted the old state leaves the
         * new one under its temporary name: no call could delete it, and
         * a later workspace of this name would be mounted on it. */
        r = store_subvolume_delete(s, incoming, NULL);
        if (r < 0 && r != -ENOENT)
                return r;
        /* Its checkpoints go with it, or it stays listed: a removal asked
         * for again deletes them. Left behind, nothing would ever delete
         * them, and a later workspace of this name would take them over. */
        r = list_checkpoints(ws, s, &checkpoints, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n && r >= 0; i++) {
                r = store_subvolume_delete(s, checkpoints[i].name, NULL);
                if (r == -ENOENT)
                        r = 0;
        }
        store_subvolume_info_array_free(checkpoints, n);
        if (r < 0)
                return r;
        for (Workspace **p = &w->list; *p; p = &(*p)->next)
                if (*p == ws) {
                        *p = ws->next;
                        break;
                }
        /* Listed, as on disk, until the list without it is saved: a
         * removal that answered an error can be asked for again. */
        r = workspaces_save(w);
        if (r < 0) {
                ws->next = w->list;
                w->list = ws;
                return r;
        }
        (void) rmdir(ws->path);
        workspace_free(ws);
        return 0;
}

int workspace_set_limit(Workspaces *w, Store *s, const char *name, uint64_t limit) {
        _cleanup_free_ char *subvolume = NULL;
        Workspace *ws = workspace_find(w, name);
        uint64_t old;
        int r;

        if (!ws)
                return -ENOENT;
        r = workspace_subvolume(name, NULL, &subvolume);
        if (r >= 0)
                r = store_subvolume_set_quota(s, subvolume, limit);
        if (r < 0)
                return r;
        old = ws->limit;
        ws->limit = limit;
        r = workspaces_save(w);
        if (r < 0) {
                /* All or nothing: the limit is the saved one again. */
                ws->limit = old;
                (void) store_subvolume_set_quota(s, subvolume, old);
                return r;
        }
        ws->warned = ws->full = false;
        return 0;
}

int workspace_checkpoint(Workspaces *w, Store *s, const char *name, const char *label) {
        _cleanup_free_ char *subvolume = NULL, *checkpoint = NULL;

        if (!workspace_find(w, name))
                return -ENOENT;
        if (!workspace_name_is_valid(label))
                return -EINVAL;
        if (workspace_subvolume(name, NULL, &subvolume) < 0 || workspace_subvolume(name, label, &checkpoint) < 0)
                return -ENOMEM;
        /* Taken by the server while it serves the workspace: everything
         * written before is in it. */
        return store_subvolume_snapshot(s, subvolume, checkpoint, true);
}

int workspace_restore_prepare(Workspaces *w, Store *s, const char *name, const char *label) {
        _cleanup_free_ char *subvolume = NULL, *checkpoint = NULL, *incoming = NULL;
        Workspace *ws = workspace_find(w, name);
        StoreSubvolumeInfo info = {};
        int r;

        if (!ws)
                return -ENOENT;
        if (!workspace_name_is_valid(label))
                return -EINVAL;
        if (workspace_subvolume(name, NULL, &subvolume) < 0 || workspace_subvolume(name, label, &checkpoint) < 0 ||
            asprintf(&incoming, "%s" WORKSPACE_RESTORING_SUFFIX, subvolume) < 0)
                return -ENOMEM;
        r = store_subvolume_show(s, checkpoint, &info);
        store_subvolume_info_clear(&info);
        if (r < 0)
                return r == -ENOENT ? -ENOKEY : r;

        /* The restored state is made first; then the workspace is switched
         * over to it: the old state deleted, the new one renamed. */
        (void) store_subvolume_delete(s, incoming, NULL);
        r = store_subvolume_snapshot(s, checkpoint, incoming, false);
        if (r >= 0)
                r = store_subvolume_set_quota(s, incoming, ws->limit);
        return r;
}

int workspace_restore_finish(Workspaces *w, Store *s, const char *name, int unmounted) {
        _cleanup_free_ char *subvolume = NULL, *incoming = NULL;
        Workspace *ws = workspace_find(w, name);
        bool deleted = false;
        int r = unmounted;

        if (!ws)
                return -ENOENT;
        if (workspace_subvolume(name, NULL, &subvolume) < 0 ||
            asprintf(&incoming, "%s" WORKSPACE_RESTORING_SUFFIX, subvolume) < 0)
                return -ENOMEM;
        if (r >= 0) {
                r = store_subvolume_delete(s, subvolume, NULL);
                if (r == -ENOENT)
                        r = 0; /* a restore that a crash cut short */
                deleted = r >= 0;
        }
        if (r >= 0)
                r = store_subvolume_rename(s, incoming, subvolume);
        if (r < 0) {
                /* Once the old state is gone the new one is all there is:
                 * the mount finishes the switch. */
                if (!deleted)
                        (void) store_subvolume_delete(s, incoming, NULL);
                return r;
        }
        ws->warned = ws->full = false;
        return 0;
}

json_t *workspace_to_json(const Workspace *ws, Store *s) {
        _cleanup_free_ char *subvolume = NULL;
        StoreSubvolumeInfo info = {};
        struct passwd *pw = getpwuid(ws->owner);
        json_t *doc;

        if (workspace_subvolume(ws->name, NULL, &subvolume) < 0)
                return NULL;
        (void) store_subvolume_show(s, subvolume, &info);
        doc = json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:b, s:b}",
                        "name", ws->name,
                        "state", workspace_server(ws, s) == WORKSPACE_SERVED ? "mounted" : "unmounted",
                        "path", ws->path,
                        "image", ws->image,
                        "owner", (json_int_t) ws->owner,
                        "owner_name", pw ? pw->pw_name : "",
                        "limit_bytes", (json_int_t) ws->limit,
                        "logical_bytes", (json_int_t) info.logical_bytes,
                        "stored_bytes", (json_int_t) info.referenced_bytes,
                        "exclusive_bytes", (json_int_t) info.exclusive_bytes,
                        "created_usec", (json_int_t) ws->created_usec,
                        "warning", ws->warned,
                        "full", ws->full,
                        "disk_full", ws->disk_full,
                        "unsafe_mount_point", ws->mount_error == -ELOOP);
        store_subvolume_info_clear(&info);
        return doc;
}

int workspace_checkpoints_json(const Workspace *ws, Store *s, json_t **ret) {
        _cleanup_free_ char *prefix = NULL;
        StoreSubvolumeInfo *infos = NULL;
        json_t *array = json_array();
        size_t n = 0;
        int r;

        r = workspace_subvolume(ws->name, "", &prefix);
        if (r >= 0)
                r = list_checkpoints(ws, s, &infos, &n);
        if (r < 0) {
                json_decref(array);
                return r;
        }
        for (size_t i = 0; i < n; i++)
                json_array_append_new(array, json_pack("{s:s, s:I, s:I}",
                                                       "label", infos[i].name + strlen(prefix),
                                                       "created_usec", (json_int_t) infos[i].created_usec,
                                                       "exclusive_bytes", (json_int_t) infos[i].exclusive_bytes));
        store_subvolume_info_array_free(infos, n);
        *ret = array;
        return 0;
}
