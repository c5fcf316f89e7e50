/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * What a sandbox leaves behind when its runner dies without cleaning up
 * (kill -9, the OOM killer, the machine lost): the snapshot made for the
 * task, its cgroups, its directories and perhaps a mount whose server died
 * too. Each run keeps a record of what it made, STORE-sandboxes/NAME.run,
 * and removes it last; a record whose owner is gone names what is left,
 * and the next run (or the daemon) removes it. One line an item:
 *
 *   owner PID START_TIME BOOT_ID PID_NAMESPACE
 *   cgroup PATH
 *   snapshot UUID NAME   (before the snapshot is made, with the UUID it
 *                         is to have, and only if the run deletes it: a
 *                         subvolume NAME with another UUID is not deleted)
 *   made-up NAME         (written by earlier versions before their
 *                         snapshot, for a name made up of the runner's
 *                         PID; still honoured for their records)
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "process-util.h"
#include "runtime-internal.h"
#include "string-util.h"

#define RECORD_SUFFIX ".run"
#define RECORD_MAX (64 * 1024)
/* A record is written right after it is made; one still empty after this
 * long lost its owner in between. */
#define RECORD_EMPTY_STALE_SEC 60

int run_record_create(const char *sandboxes_dir, const char *name, RunRecord *ret) {
        char line[PROCESS_IDENTITY_TEXT_MAX];
        int r;

        *ret = (RunRecord) { .fd = -EBADF };
        r = process_identity_text_self(line);
        if (r < 0)
                return r;
        if (asprintf(&ret->path, "%s/%s" RECORD_SUFFIX, sandboxes_dir, name) < 0) {
                ret->path = NULL;
                return -ENOMEM;
        }
        ret->fd = open(ret->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (ret->fd < 0) {
                r = -errno;
                free(ret->path);
                ret->path = NULL;
                return r;
        }
        r = run_record_add(ret, "owner", line);
        if (r < 0)
                run_record_remove(ret);
        return r;
}

int run_record_add(RunRecord *rec, const char *key, const char *value) {
        _cleanup_free_ char *line = NULL;
        int n;

        if (rec->fd < 0)
                return 0;
        if (strchr(value, '\n'))
                return -EINVAL;
        n = asprintf(&line, "%s %s\n", key, value);
        if (n < 0)
                return -ENOMEM;
        /* One write a line: a line is there whole or not at all. */
        if (write(rec->fd, line, (size_t) n) != n)
                return errno ? -errno : -EIO;
        return 0;
}

int run_record_sync(RunRecord *rec) {
        if (rec->fd < 0)
                return 0;
        if (fdatasync(rec->fd) < 0)
                return -errno;
        if (!rec->name_synced) {
                _cleanup_free_ char *dir = strdup(rec->path);
                _cleanup_close_ int fd = -EBADF;

                if (!dir)
                        return -ENOMEM;
                *strrchr(dir, '/') = 0;
                fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd < 0 || fsync(fd) < 0)
                        return -errno;
                rec->name_synced = true;
        }
        return 0;
}

void run_record_remove(RunRecord *rec) {
        if (rec->path)
                (void) unlink(rec->path);
        run_record_close(rec);
}

void run_record_close(RunRecord *rec) {
        if (rec->fd >= 0)
                (void) close(rec->fd);
        free(rec->path);
        *rec = (RunRecord) { .fd = -EBADF };
}

/* Whether the record's owner may still be at work: a record that cannot be
 * read as one (but for a recent empty one) is not ours to act on. */
static bool owner_may_live(const char *text, const struct stat *st) {
        if (!*text)
                return time(NULL) - st->st_mtime < RECORD_EMPTY_STALE_SEC;
        if (!startswith(text, "owner "))
                return true;
        /* One of another PID namespace is left to that namespace. */
        return process_identity_text_alive(text + strlen("owner "), NULL) != 0;
}

/* Only a sandbox's own cgroup, BASE/cowbox/NAME, is removed: never one
 * above it, nor the leaf of a process that manages a delegated cgroup
 * (BASE/supervisor, where BASE may be named cowbox too): removing a
 * cgroup kills what is in it. */
static bool cgroup_path_is_sandbox(const char *path) {
        const char *name = strrchr(path, '/');

        if (!startswith(path, "/sys/fs/cgroup/") || strstr(path, "/../") || strstr(path, "/./") || !name ||
            name - path < 7 || !startswith(name - 7, "/cowbox/"))
                return false;
        name++;
        return *name && !streq(name, ".") && !streq(name, "..") && !streq(name, RUNTIME_CGROUP_LEAF);
}

/* Calls f on the value of each line of the record that starts with key. */
static void record_foreach(const char *text, const char *key, void (*f)(const char *value, void *userdata),
                           void *userdata) {
        size_t k = strlen(key);

        for (const char *line = text; *line;) {
                size_t n = strcspn(line, "\n");

                if (n > k && strncmp(line, key, k) == 0 && line[k] == ' ') {
                        _cleanup_free_ char *value = strndup(line + k + 1, n - k - 1);

                        if (value)
                                f(value, userdata);
                }
                line += n + (line[n] == '\n');
        }
}

static void remove_cgroup(const char *path, void *userdata) {
        if (cgroup_path_is_sandbox(path))
                cgroup_remove_path(path);
}

typedef struct SnapshotRemoval {
        Store *store;
        char made_up_prefix[32];        /* "sandbox-PID-" of the record's owner */
        bool deleted, busy;
} SnapshotRemoval;

static void snapshot_delete(SnapshotRemoval *sr, const char *name) {
        int r = store_subvolume_delete(sr->store, name, NULL);

        if (r >= 0)
                sr->deleted = true;
        else if (r != -ENOENT)
                sr->busy = true;
}

static void remove_snapshot(const char *value, void *userdata) {
        _cleanup_(store_subvolume_info_clear) StoreSubvolumeInfo info = {};
        SnapshotRemoval *sr = userdata;
        const char *name = strchr(value, ' ');
        int r;

        if (!name)
                return;
        name++;
        r = store_subvolume_show(sr->store, name, &info);
        if (r == -ENOENT || (r >= 0 && strncmp(info.uuid, value, (size_t) (name - 1 - value)) != 0))
                return; /* gone, or the name is another's now */
        if (r < 0)
                sr->busy = true;
        else
                snapshot_delete(sr, name);
}

static void remove_made_up(const char *name, void *userdata) {
        SnapshotRemoval *sr = userdata;

        if (sr->made_up_prefix[0] && startswith(name, sr->made_up_prefix))
                snapshot_delete(sr, name);
}

/* Removes what the record names, in the order that frees each: the
 * cgroups (killing what is left in them, a server too), the mount, the
 * directories, the snapshot. 1 if a snapshot was deleted, 0 if there was
 * none, -EAGAIN if it is still in use (the record stays for next time). */
static int remove_leftovers(Store *s, const char *dir_path, int dir_fd, const char *record_name,
                            const char *text) {
        _cleanup_free_ char *base = strndup(record_name, strlen(record_name) - strlen(RECORD_SUFFIX));
        _cleanup_free_ char *own_dir = NULL, *mountpoint = NULL, *staging = NULL, *old_staging = NULL;
        SnapshotRemoval sr = { .store = s };

        if (!base || asprintf(&own_dir, "%s/%s", dir_path, base) < 0 ||
            asprintf(&mountpoint, "%s/root", own_dir) < 0 || asprintf(&staging, "%s/host", base) < 0 ||
            asprintf(&old_staging, "%s.root", base) < 0)
                return -ENOMEM;
        record_foreach(text, "cgroup", remove_cgroup, NULL);
        (void) umount2(mountpoint, MNT_DETACH | UMOUNT_NOFOLLOW);
        /* Runs of earlier versions mounted the snapshot at NAME itself,
         * and made NAME.root beside it. */
        (void) umount2(own_dir, MNT_DETACH | UMOUNT_NOFOLLOW);
        (void) unlinkat(dir_fd, mountpoint + strlen(dir_path) + 1, AT_REMOVEDIR);
        (void) unlinkat(dir_fd, staging, AT_REMOVEDIR);
        (void) unlinkat(dir_fd, base, AT_REMOVEDIR);
        (void) unlinkat(dir_fd, old_staging, AT_REMOVEDIR);
        record_foreach(text, "snapshot", remove_snapshot, &sr);
        if (!strstr(text, "\nsnapshot ")) {
                int pid;

                if (sscanf(text, "owner %d ", &pid) == 1 && pid > 0)
                        snprintf(sr.made_up_prefix, sizeof sr.made_up_prefix, "sandbox-%d-", pid);
                record_foreach(text, "made-up", remove_made_up, &sr);
        }
        if (sr.busy)
                return -EAGAIN;
        (void) unlinkat(dir_fd, record_name, 0);
        return sr.deleted;
}

int sandbox_remove_stale(Store *s) {
        _cleanup_free_ char *dir_path = NULL;
        _cleanup_closedir_ DIR *dir = NULL;
        struct dirent *de;
        int removed = 0;

        if (asprintf(&dir_path, "%s-sandboxes", store_path(s)) < 0)
                return -ENOMEM;
        dir = opendir(dir_path);
        if (!dir)
                return errno == ENOENT ? 0 : -errno;
        while ((de = readdir(dir))) {
                _cleanup_free_ char *text = NULL;
                _cleanup_close_ int fd = -EBADF;
                struct stat st;
                ssize_t n;
                int r;

                if (!endswith(de->d_name, RECORD_SUFFIX) || strlen(de->d_name) == strlen(RECORD_SUFFIX))
                        continue;
                fd = openat(dirfd(dir), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
                if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                        continue;
                /* Two cleaners at once: one does it, the other goes on. */
                if (flock(fd, LOCK_EX | LOCK_NB) < 0)
                        continue;
                text = calloc(1, RECORD_MAX + 1);
                if (!text)
                        return -ENOMEM;
                n = pread(fd, text, RECORD_MAX, 0);
                if (n < 0)
                        continue;
                text[n] = 0;
                /* Another cleaner was done with it before we looked. */
                if (fstat(fd, &st) < 0 || st.st_nlink == 0)
                        continue;
                if (owner_may_live(text, &st))
                        continue;
                r = remove_leftovers(s, dir_path, dirfd(dir), de->d_name, text);
                if (r > 0)
                        removed++;
        }
        return removed;
}
