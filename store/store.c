/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Opening and creating stores; subvolume operations on the catalog. */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "fd-util.h"
#include "process-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "time-util.h"

uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

uint64_t now_nsec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

bool uuid_string_is_valid(const char *s) {
        for (size_t i = 0; i < 36; i++)
                if (i == 8 || i == 13 || i == 18 || i == 23 ? s[i] != '-' : !isxdigit((unsigned char) s[i]))
                        return false;
        return s[36] == 0;
}

int store_uuid_new(char ret[static 37]) {
        uint8_t b[16];

        if (getrandom(b, sizeof b, 0) != sizeof b)
                return -EIO;
        b[6] = (b[6] & 0x0f) | 0x40; /* version 4 */
        b[8] = (b[8] & 0x3f) | 0x80; /* RFC 4122 variant */
        snprintf(ret, 37,
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        return 0;
}

int read_pid_file(int dir_fd, const char *name, pid_t *ret) {
        _cleanup_close_ int fd = -EBADF;
        char buf[32] = {};
        ssize_t n;

        fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        n = read(fd, buf, sizeof buf - 1);
        if (n <= 0)
                return -ENODATA;
        *ret = (pid_t) strtol(buf, NULL, 10);
        return *ret > 0 ? 0 : -ENODATA;
}

/* Names this process, and what follows it, in a lock file it holds, for
 * the messages of others. Written over the old content, then cut to its
 * length: emptying the file first would free its block only to allocate
 * it again, a good part of what a lock held for a moment costs. A reader
 * in between finds the new pid on the first line. */
int write_pid_file(int fd, const char *suffix) {
        char text[32];
        ssize_t k;
        int n;

        n = snprintf(text, sizeof text, "%d%s\n", (int) getpid(), suffix);
        k = pwrite(fd, text, (size_t) n, 0);
        if (k < 0)
                return -errno;
        if (k != n)
                return -EIO;
        if (ftruncate(fd, n) < 0)
                return -errno;
        return 0;
}

bool store_name_is_valid(const char *name) {
        size_t n;

        if (!name)
                return false;
        n = strlen(name);
        if (n == 0 || n > STORE_NAME_MAX)
                return false;
        if (streq_dot(name))
                return false;
        for (const char *p = name; *p; p++)
                if (*p == '/' || (unsigned char) *p < 0x20 || *p == 0x7f)
                        return false;
        return true;
}

const char *store_strerror(int error) {
        switch (-error) {
        case EPROTO:
                return "the store's format is newer than this program understands";
        case EUCLEAN:
                return "the store's metadata is damaged (run fsck)";
        case ENOTEMPTY:
                return "the directory is not empty and holds no store";
        case EROFS:
                return "the subvolume is read-only";
        case EBUSY:
                return "the subvolume is in use by another process";
        default:
                return NULL;
        }
}

const char *store_path(const Store *s) {
        return s->path;
}

static int open_subdir(int dir_fd, const char *name, bool create) {
        int fd;

        if (create && mkdirat(dir_fd, name, 0700) < 0 && errno != EEXIST)
                return -errno;
        fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

static int directory_is_empty(int dir_fd) {
        _cleanup_closedir_ DIR *d = opendir_dup(dir_fd);
        struct dirent *de;

        if (!d)
                return -errno;
        while ((de = readdir(d)))
                if (!streq_dot(de->d_name))
                        return false;
        return true;
}

static int catalog_write_identity(sqlite3 *db) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        uint8_t secret[STORE_SECRET_SIZE];
        char uuid[37];
        int r;

        if (getrandom(secret, sizeof secret, 0) != sizeof secret)
                return -EIO;
        r = store_uuid_new(uuid);
        if (r < 0)
                return r;

        r = sqlite_prepare(db, "INSERT INTO meta(key, value) VALUES ('format', ?1), ('uuid', ?2), "
                               "('secret', ?3), ('created_usec', ?4)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int(st, 1, STORE_FORMAT_VERSION);
        sqlite3_bind_text(st, 2, uuid, -1, SQLITE_TRANSIENT);
        sqlite3_bind_blob(st, 3, secret, sizeof secret, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 4, (sqlite3_int64) now_usec());
        return sqlite_step_done(st);
}

int store_init(const char *path) {
        _cleanup_close_ int dir_fd = -EBADF;
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_free_ char *catalog = NULL;
        int r;

        if (!path)
                return -EINVAL;
        if (mkdir(path, 0700) < 0 && errno != EEXIST)
                return -errno;
        dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return -errno;
        if (faccessat(dir_fd, "catalog.db", F_OK, 0) == 0)
                return -EEXIST;
        r = directory_is_empty(dir_fd);
        if (r < 0)
                return r;
        if (r == 0)
                return -ENOTEMPTY;

        FOREACH_STORE_SUBDIR(sub) {
                r = open_subdir(dir_fd, sub, true);
                if (r < 0)
                        return r;
                safe_close(r);
        }

        /* The catalog is created under a temporary name and renamed last, so
         * that a store either exists completely or not at all. */
        if (asprintf(&catalog, "%s/catalog.db.new", path) < 0)
                return -ENOMEM;
        (void) unlink(catalog);
        r = sqlite_open(catalog, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, false, &db);
        if (r >= 0)
                r = row_check_register(db);
        if (r < 0)
                return r;
        r = sqlite_exec(db, "BEGIN");
        if (r >= 0)
                r = catalog_create_schema(db);
        if (r >= 0)
                r = catalog_write_identity(db);
        if (r >= 0)
                r = sqlite_commit(db);
        if (r < 0)
                return r;
        sqlite3_close_v2(TAKE_PTR(db));

        if (renameat(dir_fd, "catalog.db.new", dir_fd, "catalog.db") < 0)
                return -errno;
        if (fsync(dir_fd) < 0)
                return -errno;
        return 0;
}

static int catalog_read_identity(Store *s) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(s->catalog, "SELECT key, value FROM meta", &st);
        if (r < 0)
                return r;
        s->uuid[0] = 0;
        while ((r = sqlite_step_row(st)) > 0) {
                const char *key = (const char *) sqlite3_column_text(st, 0);

                if (streq(key, "format")) {
                        if (sqlite3_column_int(st, 1) > STORE_FORMAT_VERSION)
                                return -EPROTO;
                } else if (streq(key, "uuid"))
                        snprintf(s->uuid, sizeof s->uuid, "%s", (const char *) sqlite3_column_text(st, 1));
                else if (streq(key, "secret")) {
                        if (sqlite3_column_bytes(st, 1) != STORE_SECRET_SIZE)
                                return -EUCLEAN;
                        memcpy(s->secret, sqlite3_column_blob(st, 1), STORE_SECRET_SIZE);
                }
        }
        if (r < 0)
                return r;
        return s->uuid[0] ? 0 : -EUCLEAN;
}

/* The stores this process has open, for store_close_inherited(). */
static pthread_mutex_t open_stores_lock = PTHREAD_MUTEX_INITIALIZER;
static Store *open_stores;

static void open_stores_add(Store *s) {
        MUTEX_LOCKED(&open_stores_lock);
        s->open_next = open_stores;
        if (open_stores)
                open_stores->open_prev = s;
        open_stores = s;
}

static void open_stores_remove(Store *s) {
        MUTEX_LOCKED(&open_stores_lock);
        if (s->open_prev)
                s->open_prev->open_next = s->open_next;
        else if (open_stores == s)
                open_stores = s->open_next;
        if (s->open_next)
                s->open_next->open_prev = s->open_prev;
        s->open_prev = s->open_next = NULL;
}

void store_close_inherited(void) {
        /* The child has one thread: a lock another thread of the parent
         * held at fork() would never be released. */
        pthread_mutex_init(&open_stores_lock, NULL);
        while (open_stores)
                store_close(open_stores);
}

int store_open(const char *path, Store **ret) {
        _cleanup_(store_closep) Store *s = NULL;
        _cleanup_free_ char *catalog = NULL;
        int r;

        if (!path || !ret)
                return -EINVAL;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->dir_fd = s->packs_fd = s->layers_fd = s->locks_fd = -EBADF;
        {
                pthread_mutexattr_t attr;

                pthread_mutexattr_init(&attr);
                pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
                pthread_mutex_init(&s->catalog_lock, &attr);
                pthread_mutexattr_destroy(&attr);
        }
        pthread_mutex_init(&s->space.lock, NULL);
        pthread_mutex_init(&s->claims_lock, NULL);
        /* Absolute: a background server changes its directory to "/". */
        s->path = realpath(path, NULL);
        if (!s->path)
                return errno == ENOMEM ? -ENOMEM : -ENOENT;

        s->dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (s->dir_fd < 0)
                return -errno;
        if (faccessat(s->dir_fd, "catalog.db", F_OK, 0) < 0)
                return -ENOENT;

        s->packs_fd = open_subdir(s->dir_fd, "packs", false);
        if (s->packs_fd < 0)
                return -EUCLEAN;
        s->layers_fd = open_subdir(s->dir_fd, "layers", false);
        if (s->layers_fd < 0)
                return -EUCLEAN;
        s->locks_fd = open_subdir(s->dir_fd, "locks", false);
        if (s->locks_fd < 0)
                return -EUCLEAN;

        /* Before the catalog: on a full disk, it cannot be opened without
         * the reserve's space. */
        space_update(s);

        if (asprintf(&catalog, "%s/catalog.db", path) < 0)
                return -ENOMEM;
        r = sqlite_open(catalog, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, true, &s->catalog);
        /* SQLite says it cannot open what is there: the store is on a
         * read-only file system, or not ours to write (even reading needs
         * the WAL's index), not missing. */
        if (r == -ENOENT && (faccessat(s->dir_fd, "catalog.db", W_OK, AT_EACCESS) < 0 ||
                             faccessat(s->dir_fd, ".", W_OK, AT_EACCESS) < 0))
                return errno == EROFS ? -EROFS : -EACCES;
        if (r >= 0)
                r = row_check_register(s->catalog);
        if (r < 0)
                return r;
        r = catalog_read_identity(s);
        if (r < 0)
                return r;
        r = catalog_upgrade(s);
        if (r >= 0)
                r = catalog_check_identity(s);
        if (r < 0)
                return r;
        r = packs_new(s, &s->packs);
        if (r < 0)
                return r;
        r = dictionaries_new(s, &s->dicts);
        if (r < 0)
                return r;

        open_stores_add(s);
        *ret = TAKE_PTR(s);
        return 0;
}

Store *store_close(Store *s) {
        if (!s)
                return NULL;
        open_stores_remove(s);
        store_claims_close(s);
        s->packs = packs_free(s->packs);
        s->dicts = dictionaries_free(s->dicts);
        sqlite3_finalize(s->find_block);
        if (s->catalog)
                sqlite3_close_v2(s->catalog);
        safe_close(s->locks_fd);
        safe_close(s->layers_fd);
        safe_close(s->packs_fd);
        safe_close(s->dir_fd);
        pthread_mutex_destroy(&s->catalog_lock);
        pthread_mutex_destroy(&s->space.lock);
        pthread_mutex_destroy(&s->claims_lock);
        free(s->path);
        free(s);
        return NULL;
}

void store_subvolume_info_clear(StoreSubvolumeInfo *info) {
        if (!info)
                return;
        free(info->name);
        info->name = NULL;
}

void store_subvolume_info_array_free(StoreSubvolumeInfo *infos, size_t n) {
        for (size_t i = 0; i < n; i++)
                store_subvolume_info_clear(&infos[i]);
        free(infos);
}

int store_subvolume_create(Store *s, const char *name) {
        _cleanup_sqlite_ sqlite3 *layer = NULL;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        LayerCounters counters = { .next_ino = 2 };
        char uuid[37];
        uint64_t layer_id = 0, transid;
        int r;

        if (!store_name_is_valid(name))
                return -EINVAL;
        r = store_uuid_new(uuid);
        if (r < 0)
                return r;

        CATALOG_LOCKED(s);

        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;
        r = catalog_new_layer(s, 0, &layer_id);
        if (r < 0)
                goto fail;

        r = catalog_next_transid(s, &transid);
        if (r < 0)
                goto fail;
        r = sqlite_prepare(s->catalog,
                           "INSERT INTO subvolumes(name, uuid, parent_uuid, readonly, created_usec, top_layer, ctransid) "
                           "VALUES (?1, ?2, '', 0, ?3, ?4, ?5)", &st);
        if (r < 0)
                goto fail;
        sqlite3_bind_int64(st, 5, (sqlite3_int64) transid);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, uuid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64) now_usec());
        sqlite3_bind_int64(st, 4, (sqlite3_int64) layer_id);
        r = sqlite_step_done(st);
        if (r < 0)
                goto fail;

        /* The layer's database, with its root directory, exists before the
         * catalog names it: a crash in between leaves an orphan file that
         * the reaper removes, never a subvolume without a root. */
        r = layer_create(s, layer_id, &counters, true, &layer);
        if (r < 0)
                goto fail;
        r = sqlite_commit(s->catalog);
        /* A commit reported as failed may be durable all the same (stopped
         * after it was written): then the catalog names the layer, which
         * must stay. */
        if (r < 0 && catalog_id_known(s, "layers", layer_id) > 0)
                return 0;
        if (r < 0)
                goto fail;
        return 0;

fail:
        sqlite_rollback(s->catalog);
        if (layer) {
                sqlite3_close_v2(TAKE_PTR(layer));
                (void) layer_unlink(s, layer_id);
        }
        return r;
}

/* A reaper may fold the source's top layer into a new one at any time but
 * while the source's lock is held: what was read before the lock can be
 * stale, and a read-only source is not locked at all. */
#define STALE_ATTEMPTS 8
/* A server holds the lock from before it serves its control socket (it
 * loads the layers, drops what files unlinked while open left) until
 * after it stops serving it (the last commit): a snapshot waits for
 * either end of that rather than fail, for a while (cowboxd waits with
 * it). */
#define SERVER_WAIT_USEC 10000000u
#define SERVER_RETRY_USEC 10000

static int snapshot_once(Store *s, const char *source, const char *name, bool readonly, const char *uuid) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord src = {};
        _cleanup_close_ int lock_fd = -EBADF;
        uint64_t id;
        int r;

        r = catalog_find_subvolume(s, source, &src);
        if (r < 0)
                return r;
        if (src.readonly)
                return catalog_snapshot(s, &src, name, readonly, uuid);

        /* A writable source: whoever holds its lock owns its top layer. If a
         * server has it mounted, it takes the snapshot itself, at a point
         * where everything written before is committed. */
        lock_fd = subvolume_lock_full(s, src.id, true, SUBVOLUME_LOCK_BRIEF, NULL);
        if (lock_fd == -EBUSY) {
                /* Mounted read-only only: nobody writes its top, and a
                 * shared lock keeps it so while the snapshot freezes it. */
                lock_fd = subvolume_lock_full(s, src.id, false, SUBVOLUME_LOCK_UNNAMED, NULL);
                if (lock_fd == -EBUSY)
                        return control_request_snapshot(s, src.id, name, readonly, uuid);
        }
        if (lock_fd < 0)
                return lock_fd;

        /* Read again now that nobody can fold it: the reaper may have held
         * the lock while we waited for it. */
        id = src.id;
        subvolume_record_clear(&src);
        r = catalog_find_subvolume_by_id(s, id, &src);
        if (r < 0)
                return r;
        r = layer_seal(s, src.top_layer);
        if (r < 0)
                return r;
        return catalog_snapshot(s, &src, name, readonly, uuid);
}

int store_subvolume_snapshot(Store *s, const char *source, const char *name, bool readonly) {
        char uuid[37];
        int r;

        r = store_uuid_new(uuid);
        if (r < 0)
                return r;
        return store_subvolume_snapshot_as(s, source, name, readonly, uuid);
}

int store_subvolume_snapshot_as(Store *s, const char *source, const char *name, bool readonly, const char *uuid) {
        SubvolumeRecord existing = {};
        uint64_t deadline = 0;
        int r;

        if (!store_name_is_valid(source) || !store_name_is_valid(name) || !uuid || !uuid_string_is_valid(uuid))
                return -EINVAL;

        r = catalog_find_subvolume(s, name, &existing);
        subvolume_record_clear(&existing);
        if (r >= 0)
                return -EEXIST;
        if (r != -ENOENT)
                return r;

        for (unsigned attempt = 1;;) {
                r = snapshot_once(s, source, name, readonly, uuid);
                if (r == -ECONNREFUSED) {
                        if (deadline == 0)
                                deadline = monotonic_usec() + SERVER_WAIT_USEC;
                        else if (monotonic_usec() >= deadline)
                                return -EBUSY;
                        (void) usleep(SERVER_RETRY_USEC);
                        continue;
                }
                if (r != -ESTALE)
                        return r;
                if (++attempt > STALE_ATTEMPTS)
                        return -EAGAIN;
        }
}

/* A subvolume whose record is damaged cannot be used, and keeps the
 * reaper from freeing anything: deleting it removes the record at once.
 * The reaper then frees what only it held, as far as it can tell. */
static int delete_damaged(Store *s, uint64_t id, pid_t *ret_holder) {
        _cleanup_close_ int lock_fd = -EBADF;
        int r;

        /* A server that mounted it before the damage still serves it. */
        lock_fd = subvolume_lock_full(s, id, true, SUBVOLUME_LOCK_BRIEF, ret_holder);
        if (lock_fd < 0)
                return lock_fd;
        r = catalog_remove_damaged_subvolume(s, id);
        if (r < 0)
                return r;
        store_log("subvolume %" PRIu64 ", whose record in the catalog was damaged, is deleted", id);
        return 0;
}

static int delete_record(Store *s, const SubvolumeRecord *rec, pid_t *ret_holder) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_close_ int lock_fd = -EBADF;
        int r;

        /* Deleting is how a full disk is cleaned up: a long-lived process
         * (cowboxd) opened the store when there was room. */
        space_update(s);

        /* Held for one update only: another delete, or a snapshot, of it
         * waits and then finds it gone, rather than be told it is mounted. */
        lock_fd = subvolume_lock_full(s, rec->id, true, SUBVOLUME_LOCK_BRIEF, ret_holder);
        if (lock_fd < 0)
                return lock_fd;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET deleted = 1 WHERE id = ?1 AND deleted = 0", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) rec->id);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        return sqlite3_changes(s->catalog) > 0 ? 0 : -ENOENT;
}

int store_subvolume_delete(Store *s, const char *name, pid_t *ret_holder) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        uint64_t id;
        int r;

        if (!store_name_is_valid(name))
                return -EINVAL;
        r = catalog_find_subvolume(s, name, &rec);
        if (r == -EUCLEAN || r == -ENOENT) {
                int k = catalog_damaged_subvolume_id(s, name, &id);
                if (k >= 0)
                        k = delete_damaged(s, id, ret_holder);
                return k == -ENOENT ? r : k;
        }
        if (r < 0)
                return r;
        return delete_record(s, &rec, ret_holder);
}

int store_subvolume_delete_id(Store *s, uint64_t id, pid_t *ret_holder) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        int r;

        r = catalog_find_subvolume_by_id(s, id, &rec);
        /* One marked deleted, which scrub names, keeps the reaper from
         * freeing anything too: that flag is not to be believed either. */
        if (r == -ENOENT && catalog_subvolume_is_damaged(s, id) > 0)
                r = -EUCLEAN;
        if (r == -EUCLEAN)
                return delete_damaged(s, id, ret_holder);
        if (r < 0)
                return r;
        return delete_record(s, &rec, ret_holder);
}

static int set_quota_record(Store *s, const char *name, uint64_t bytes, uint64_t *ret_id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET quota_bytes = ?1 WHERE name = ?2 AND deleted = 0 "
                                       "RETURNING id", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) bytes);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -ENOENT;
        *ret_id = (uint64_t) sqlite3_column_int64(st, 0);
        return sqlite_step_done(st);
}

int store_subvolume_set_quota(Store *s, const char *name, uint64_t bytes) {
        uint64_t id;
        int r;

        if (!store_name_is_valid(name) || bytes > (uint64_t) INT64_MAX)
                return -EINVAL;

        r = set_quota_record(s, name, bytes, &id);
        if (r < 0)
                return r;
        /* A server reads the quota again at its next commit, up to a
         * second away: told now, it holds the next write to a lower one. */
        (void) control_request_quota(s, id);
        return 0;
}

static int subvolume_info_from_record(Store *s, SubvolumeRecord *rec, const LayerUsers *all_users, size_t n_users,
                                      StoreSubvolumeInfo *ret);
static int subvolume_info_one(Store *s, SubvolumeRecord *rec, StoreSubvolumeInfo *ret);

static int set_readonly_once(Store *s, const char *name, bool readonly) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        _cleanup_close_ int lock_fd = -EBADF;
        uint64_t id;
        int r;

        r = catalog_find_subvolume(s, name, &rec);
        if (r < 0)
                return r;
        if (rec.readonly == readonly)
                return 0;

        /* Nobody may serve it while its top layer changes hands; read it
         * again once that is so (see snapshot_once()). */
        lock_fd = subvolume_lock_full(s, rec.id, true, SUBVOLUME_LOCK_BRIEF, NULL);
        if (lock_fd < 0)
                return lock_fd;
        id = rec.id;
        subvolume_record_clear(&rec);
        r = catalog_find_subvolume_by_id(s, id, &rec);
        if (r < 0)
                return r;
        if (rec.readonly == readonly)
                return 0;
        if (readonly) {
                r = layer_seal(s, rec.top_layer);
                if (r < 0)
                        return r;
        }
        return catalog_set_readonly(s, &rec, readonly);
}

int store_subvolume_set_readonly(Store *s, const char *name, bool readonly) {
        if (!store_name_is_valid(name))
                return -EINVAL;

        for (unsigned attempt = 1;; attempt++) {
                int r = set_readonly_once(s, name, readonly);

                if (r != -ESTALE)
                        return r;
                if (attempt >= STALE_ATTEMPTS)
                        return -EAGAIN;
        }
}

static int rename_one(Store *s, sqlite3_stmt *st, const char *name, const char *new_name) {
        int r;

        if (!store_name_is_valid(name) || !store_name_is_valid(new_name))
                return -EINVAL;
        if (streq(name, new_name))
                return 0;
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, new_name, -1, SQLITE_STATIC);
        r = sqlite_step_done(st);      /* -EEXIST if the new name is taken */
        if (r < 0)
                return r;
        return sqlite3_changes(s->catalog) > 0 ? 0 : -ENOENT;
}

int store_subvolume_rename(Store *s, const char *name, const char *new_name) {
        const StoreRename rename = { name, new_name };

        return store_subvolumes_rename(s, &rename, 1, NULL);
}

int store_subvolumes_rename(Store *s, const StoreRename *renames, size_t n, size_t *ret_failed) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        size_t i = 0;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET name = ?2 WHERE name = ?1 AND deleted = 0", &st);
        if (r >= 0 && n > 1)
                r = sqlite_begin(s->catalog);
        if (r < 0)
                goto fail;
        for (; i < n; i++) {
                r = rename_one(s, st, renames[i].name, renames[i].new_name);
                if (r < 0) {
                        if (n > 1)
                                sqlite_rollback(s->catalog);
                        goto fail;
                }
        }
        if (n > 1) {
                i = n;  /* the commit's failure concerns none in particular */
                r = sqlite_commit(s->catalog);
                if (r < 0)
                        goto fail;
        }
        return 0;
fail:
        if (ret_failed)
                *ret_failed = i;
        return r;
}

int store_subvolume_set_received(Store *s, const char *name, const char *received_uuid, uint64_t stransid) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        if (!store_name_is_valid(name) || !received_uuid || strlen(received_uuid) != 36 ||
            stransid > (uint64_t) INT64_MAX)
                return -EINVAL;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET received_uuid = ?2, stransid = ?3 "
                                       "WHERE name = ?1 AND deleted = 0", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, received_uuid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64) stransid);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        return sqlite3_changes(s->catalog) > 0 ? 0 : -ENOENT;
}

int store_subvolume_find_uuid(Store *s, const char *uuid, StoreSubvolumeInfo *ret) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        int r;

        if (!uuid || strlen(uuid) != 36)
                return -EINVAL;
        r = catalog_find_subvolume_by_uuid(s, uuid, true, &rec);
        if (r == -ENOENT)
                r = catalog_find_subvolume_by_uuid(s, uuid, false, &rec);
        if (r < 0)
                return r;
        return subvolume_info_one(s, &rec, ret);
}

static int layer_users_compare(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = ((const LayerUsers *) b)->layer;

        return x < y ? -1 : x > y;
}

/* Whether the subvolume's stack is still ids: 1 if so, 0 if it changed,
 * -ENOENT if the reaper forgot the subvolume meanwhile. */
static int stack_is_current(Store *s, uint64_t id, const uint64_t *ids, size_t n) {
        _cleanup_free_ uint64_t *now_ids = NULL;
        size_t now_n = 0;
        int r;

        r = catalog_subvolume_stack(s, id, &now_ids, &now_n);
        if (r == -EUCLEAN)
                return 0;
        if (r < 0)
                return r;
        return now_n == n && memcmp(now_ids, ids, n * sizeof *ids) == 0;
}

/* Fills the space figures of one subvolume from its layers, each opened
 * once: all but a writable subvolume's top are frozen and read as they
 * are, without the journal files and locks of a connection that could
 * write. Whether a layer is shared comes from all_users, or for a single
 * subvolume (all_users NULL) from the catalog, layer by layer. -ESTALE if
 * layers of the stack went while it was read, -ENOENT if the subvolume
 * itself went (forgotten by the reaper), -EUCLEAN if its records are
 * damaged. */
static int subvolume_fill_space(Store *s, const LayerUsers *all_users, size_t n_users, StoreSubvolumeInfo *info) {
        _cleanup_free_ uint64_t *ids = NULL;
        bool counted = false, lost = false, shared = false, missing = false;
        size_t n = 0;
        int r;

        /* Read from the record anew: a fold may have changed it since. */
        r = catalog_subvolume_stack(s, info->id, &ids, &n);
        if (r < 0)
                return r;
        info->top_layer = ids[0];
        info->depth = (unsigned) n;
        info->logical_bytes = info->inodes = info->referenced_bytes = info->exclusive_bytes = 0;

        for (size_t i = 0; i < n; i++) {
                LayerOpenMode mode = i == 0 && !info->readonly ? LAYER_READ : LAYER_READ_FROZEN;
                _cleanup_sqlite_ sqlite3 *db = NULL;
                const LayerUsers *users;
                LayerCounters lc = {};

                r = layer_open(s, ids[i], mode, &db);
                /* A top layer not made yet; one the reaper removed since
                 * the stack was read; or one lost, which fsck and scrub
                 * name: the listing of the others goes on. */
                if (r == -EUCLEAN)
                        lost = true;
                if (r == -ENOENT || r == -EUCLEAN) {
                        missing = true;
                        continue;
                }
                if (r < 0)
                        return r;
                r = layer_read_counters(db, &lc);
                if (r < 0)
                        return r;
                /* The files and bytes are the topmost database's. */
                if (!counted) {
                        info->logical_bytes = lc.logical_bytes;
                        info->inodes = lc.inodes;
                        counted = true;
                }
                info->referenced_bytes += lc.stored_bytes;

                /* A layer below a shared one is shared too. One that
                 * all_users does not know was made by a fold since. */
                users = all_users && !shared ? bsearch(&ids[i], all_users, n_users, sizeof *all_users,
                                                      layer_users_compare) : NULL;
                if (users)
                        shared = users->users > 1;
                else if (!shared) {
                        r = catalog_layer_is_shared(s, ids[i]);
                        if (r < 0)
                                return r;
                        shared = r > 0;
                }
                if (!shared)
                        info->exclusive_bytes += lc.stored_bytes;
        }
        /* Layers the reaper folded away since the stack was read: the
         * caller reads the new one. */
        if (missing) {
                r = stack_is_current(s, info->id, ids, n);
                if (r <= 0)
                        return r < 0 ? r : -ESTALE;
        }
        /* Every stack has a bottom layer with a root, unless it is lost. */
        return counted || lost ? 0 : -EUCLEAN;
}

/* What the record says: all but the space. Takes its name. */
static void info_from_record(SubvolumeRecord *rec, StoreSubvolumeInfo *ret) {
        *ret = (StoreSubvolumeInfo) {
                .id = rec->id,
                .name = TAKE_PTR(rec->name),
                .readonly = rec->readonly,
                .created_usec = rec->created_usec,
                .top_layer = rec->top_layer,
                .quota_bytes = rec->quota_bytes,
                .ctransid = rec->ctransid,
                .stransid = rec->stransid,
        };
        memcpy(ret->uuid, rec->uuid, sizeof ret->uuid);
        memcpy(ret->parent_uuid, rec->parent_uuid, sizeof ret->parent_uuid);
        memcpy(ret->received_uuid, rec->received_uuid, sizeof ret->received_uuid);
}

/* On failure the record keeps its name. */
static int subvolume_info_from_record(Store *s, SubvolumeRecord *rec, const LayerUsers *all_users, size_t n_users,
                                      StoreSubvolumeInfo *ret) {
        pid_t holder = 0;
        int r;

        info_from_record(rec, ret);
        if (subvolume_lock_holder(s, rec->id, &holder) > 0)
                ret->mounted_by = holder;

        /* Layers of the stack gone since it was read: the reaper folded
         * them into new ones. Read it again; one that changes at every
         * reading is taken for broken. The subvolume forgotten since the
         * catalog was read (deleted meanwhile): -ENOENT. */
        for (unsigned attempt = 1;; attempt++) {
                r = subvolume_fill_space(s, all_users, n_users, ret);
                if (r != -ESTALE || attempt >= STALE_ATTEMPTS)
                        break;
        }
        if (r == -ESTALE)
                r = -EUCLEAN;
        if (r < 0) {
                rec->name = TAKE_PTR(ret->name);
                store_subvolume_info_clear(ret);
                return r;
        }
        return 0;
}

/* One subvolume: the users of every layer come in one query all the same,
 * which costs what asking for one layer's does. */
static int subvolume_info_one(Store *s, SubvolumeRecord *rec, StoreSubvolumeInfo *ret) {
        return subvolume_info_from_record(s, rec, NULL, 0, ret);
}

int store_subvolume_show(Store *s, const char *name, StoreSubvolumeInfo *ret) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        int r;

        if (!store_name_is_valid(name))
                return -EINVAL;
        r = catalog_find_subvolume(s, name, &rec);
        if (r < 0)
                return r;
        return subvolume_info_one(s, &rec, ret);
}

int store_subvolume_exists(Store *s, const char *name) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        int r;

        if (!store_name_is_valid(name))
                return -EINVAL;
        r = catalog_find_subvolume(s, name, &rec);
        if (r == -ENOENT)
                return 0;
        return r < 0 ? r : 1;
}

int store_subvolume_names(Store *s, char ***ret) {
        return catalog_subvolume_names(s, ret);
}

int store_subvolume_list(Store *s, StoreSubvolumeInfo **ret, size_t *ret_n) {
        _cleanup_free_ SubvolumeRecord *recs = NULL;
        _cleanup_free_ LayerUsers *users = NULL;
        StoreSubvolumeInfo *infos = NULL;
        size_t n = 0, n_users = 0, listed = 0;
        int r;

        r = catalog_list_subvolumes(s, false, &recs, &n);
        if (r < 0)
                return r;
        r = catalog_all_layer_users(s, &users, &n_users);
        if (r < 0)
                goto finish;

        infos = calloc(MAX(n, 1u), sizeof *infos);
        if (!infos) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t i = 0; i < n; i++) {
                if (recs[i].damaged) {
                        infos[listed++] = (StoreSubvolumeInfo) {
                                .id = recs[i].id,
                                .name = TAKE_PTR(recs[i].name),
                                .damaged = true,
                        };
                        continue;
                }
                r = subvolume_info_from_record(s, &recs[i], users, n_users, &infos[listed]);
                if (r == -ENOENT)
                        continue;       /* deleted since the catalog was read */
                if (r == -EUCLEAN) {
                        /* A sound record over a damaged stack: all but its
                         * space is known. */
                        info_from_record(&recs[i], &infos[listed]);
                        infos[listed].damaged = true;
                        r = 0;
                }
                if (r < 0) {
                        store_subvolume_info_array_free(infos, listed);
                        infos = NULL;
                        goto finish;
                }
                listed++;
        }
        *ret = infos;
        *ret_n = listed;
        r = 0;
finish:
        for (size_t i = 0; i < n; i++)
                subvolume_record_clear(&recs[i]);
        return r;
}

uint64_t layer_reclaimable_bytes(Store *s, uint64_t id) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        LayerCounters lc = {};

        /* Not immutable: a layer the reaper is folding into is
         * unreachable, and written, until the fold is done. */
        if (layer_open(s, id, LAYER_READ, &db) < 0)
                return 0;
        (void) layer_read_counters(db, &lc);
        return lc.stored_bytes + layer_file_bytes(s, id);
}

int store_space(Store *s, StoreSpace *ret) {
        _cleanup_free_ uint64_t *dead = NULL;
        uint64_t folding = 0;
        pid_t folder = 0;
        struct statvfs sv;
        size_t n_dead = 0;
        int r;

        *ret = (StoreSpace) {};

        r = catalog_dead_layers(s, &dead, &n_dead);
        if (r >= 0)
                r = catalog_folding_layer(s, &folding, &folder);
        if (r == -EUCLEAN)
                r = 0;  /* a damaged record of a fold: counted as none, the reaper refuses it */
        if (r < 0)
                return r;
        for (size_t i = 0; i < n_dead; i++) {
                /* A fold's merged layer repeats the rows of live layers: it
                 * frees none of the blocks it counts. Being built, it is
                 * about to be live; left by a fold that died, its own file
                 * is what the next reap frees. */
                if (dead[i] == folding) {
                        if (folder <= 0 || process_is_exiting(folder))
                                ret->reclaimable_bytes += layer_file_bytes(s, dead[i]);
                        continue;
                }
                ret->reclaimable_bytes += layer_reclaimable_bytes(s, dead[i]);
        }
        ret->reclaimable_bytes += reaper_pending_bytes(s);

        if (fstatvfs(s->dir_fd, &sv) >= 0) {
                ret->fs_free_bytes = (uint64_t) sv.f_bavail * sv.f_frsize;
                ret->fs_total_bytes = (uint64_t) sv.f_blocks * sv.f_frsize;
                ret->fs_reserved_bytes = space_margin_of(ret->fs_total_bytes);
        }
        ret->reserve_bytes = space_reserve_held(s->dir_fd);
        return 0;
}

int store_usage(Store *s, StoreUsage *ret) {
        StoreSubvolumeInfo *infos = NULL;
        size_t n = 0;
        int r;

        r = store_usage_listed(s, ret, &infos, &n);
        if (r >= 0)
                store_subvolume_info_array_free(infos, n);
        return r;
}

/* What the catalog and the host file system say; the caller sums the
 * listing. */
static int usage_of_catalog(Store *s, StoreUsage *ret) {
        int64_t v;
        int r;

        r = catalog_block_totals(s, &ret->blocks, &ret->data_bytes);
        if (r < 0)
                return r;
        r = catalog_metadata_bytes(s, &ret->metadata_bytes, &ret->layers);
        if (r < 0)
                return r;
        ret->stored_bytes = ret->data_bytes + ret->metadata_bytes;
        ret->pack_file_bytes = packs_disk_bytes(s);

        r = store_space(s, &ret->space);
        if (r < 0)
                return r;

        v = 0;
        {
                CATALOG_LOCKED(s);
                r = sqlite_query_int(s->catalog, "SELECT count(*) FROM subvolumes WHERE deleted = 1", &v);
                if (r < 0)
                        return r;
                ret->deleted_subvolumes = (uint64_t) v;
                v = 0;
                /* Damaged, it counts for nothing (scrub names it). */
                r = sqlite_query_int(s->catalog, "SELECT value FROM counters WHERE key = 'corruption_events' "
                                                 "AND row_check IS " COUNTER_CHECK_OF("counters."), &v);
                if (r < 0)
                        return r;
        }
        ret->corruption_events = (uint64_t) v;
        return 0;
}

int store_usage_listed(Store *s, StoreUsage *ret, StoreSubvolumeInfo **ret_infos, size_t *ret_n) {
        StoreSubvolumeInfo *infos = NULL;
        size_t n = 0;
        int r;

        *ret = (StoreUsage) {};

        r = store_subvolume_list(s, &infos, &n);
        if (r < 0)
                return r;
        ret->subvolumes = n;
        for (size_t i = 0; i < n; i++) {
                ret->logical_bytes += infos[i].logical_bytes;
                ret->damaged_subvolumes += infos[i].damaged;
        }
        r = usage_of_catalog(s, ret);
        if (r < 0) {
                store_subvolume_info_array_free(infos, n);
                return r;
        }
        *ret_infos = infos;
        *ret_n = n;
        return 0;
}
