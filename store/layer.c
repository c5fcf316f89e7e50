/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Layer databases: one SQLite file per layer with the inodes, directory
 * entries, xattrs and extents that the layer changes relative to the
 * layers below it. */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "sqlite-util.h"
#include "store-internal.h"

/* How long a seal waits for readers of the layer to go: 5 s. */
#define SEAL_ATTEMPTS 500
#define SEAL_RETRY_USEC 10000

/* dentries with ino 0 are whiteouts hiding a name of a lower layer; extents
 * with a NULL digest are holes hiding a lower layer's block; lower_limit is
 * the offset from which the lower layers' extents of an inode no longer
 * count (it shrinks on truncate); data holds a small file's content (zstd
 * compressed if data_zstd) or a symlink's target, with data_check, the
 * XXH3-64 of the stored bytes: SQLite checksums none of its pages. */
static const char layer_schema[] =
        "CREATE TABLE info(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;"
        "CREATE TABLE inodes("
        "  ino INTEGER PRIMARY KEY,"
        "  mode INTEGER NOT NULL,"
        "  nlink INTEGER NOT NULL,"
        "  uid INTEGER NOT NULL,"
        "  gid INTEGER NOT NULL,"
        "  rdev INTEGER NOT NULL,"
        "  size INTEGER NOT NULL,"
        "  atime_ns INTEGER NOT NULL,"
        "  mtime_ns INTEGER NOT NULL,"
        "  ctime_ns INTEGER NOT NULL,"
        "  parent INTEGER NOT NULL,"
        "  lower_limit INTEGER NOT NULL,"
        "  data BLOB,"
        "  data_zstd INTEGER NOT NULL DEFAULT 0,"
        "  data_check INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE dentries("
        "  parent INTEGER NOT NULL,"
        "  name BLOB NOT NULL,"
        "  ino INTEGER NOT NULL,"
        "  type INTEGER NOT NULL,"
        "  PRIMARY KEY (parent, name)) WITHOUT ROWID;"
        "CREATE TABLE xattrs("
        "  ino INTEGER NOT NULL,"
        "  name BLOB NOT NULL,"
        "  value BLOB NOT NULL,"
        "  PRIMARY KEY (ino, name)) WITHOUT ROWID;"
        "CREATE TABLE extents("
        "  ino INTEGER NOT NULL,"
        "  idx INTEGER NOT NULL,"
        "  digest BLOB,"
        "  len INTEGER NOT NULL,"
        "  PRIMARY KEY (ino, idx)) WITHOUT ROWID;"
        "CREATE TABLE blockrefs("
        "  digest BLOB PRIMARY KEY,"
        "  refs INTEGER NOT NULL,"
        "  stored_len INTEGER NOT NULL) WITHOUT ROWID;";

int layer_path(Store *s, uint64_t id, char **ret) {
        return asprintf(ret, "%s/layers/%" PRIu64 ".db", s->path, id) < 0 ? -ENOMEM : 0;
}

static void layer_file_name(uint64_t id, const char *suffix, char ret[static 64]) {
        snprintf(ret, 64, "%" PRIu64 ".db%s", id, suffix);
}

int layer_exists(Store *s, uint64_t id) {
        char name[64];

        layer_file_name(id, "", name);
        if (faccessat(s->layers_fd, name, F_OK, 0) < 0)
                return errno == ENOENT ? 0 : -errno;
        return 1;
}

int layer_write_counters(sqlite3 *db, const LayerCounters *c) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(db, "INSERT OR REPLACE INTO info(key, value) VALUES "
                               "('next_ino', ?1), ('logical_bytes', ?2), ('inodes', ?3), ('stored_bytes', ?4)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) c->next_ino);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) c->logical_bytes);
        sqlite3_bind_int64(st, 3, (sqlite3_int64) c->inodes);
        sqlite3_bind_int64(st, 4, (sqlite3_int64) c->stored_bytes);
        return sqlite_step_done(st);
}

int layer_read_counters(sqlite3 *db, LayerCounters *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        *ret = (LayerCounters) {};
        r = sqlite_prepare(db, "SELECT key, value FROM info", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                const char *key = (const char *) sqlite3_column_text(st, 0);
                uint64_t v = (uint64_t) sqlite3_column_int64(st, 1);

                if (streq(key, "next_ino"))
                        ret->next_ino = v;
                else if (streq(key, "logical_bytes"))
                        ret->logical_bytes = v;
                else if (streq(key, "inodes"))
                        ret->inodes = v;
                else if (streq(key, "stored_bytes"))
                        ret->stored_bytes = v;
        }
        if (r < 0)
                return r;
        return ret->next_ino > 0 ? 0 : -EUCLEAN;
}

static int insert_root(sqlite3 *db) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int64_t now = (int64_t) now_nsec();
        int r;

        r = sqlite_prepare(db, "INSERT INTO inodes(ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, "
                               "ctime_ns, parent, lower_limit, data) VALUES (1, ?1, 2, 0, 0, 0, 0, ?2, ?2, ?2, 1, 0, NULL)",
                           &st);
        if (r < 0)
                return r;
        sqlite3_bind_int(st, 1, S_IFDIR | 0755);
        sqlite3_bind_int64(st, 2, now);
        return sqlite_step_done(st);
}

/* Creates the layer's database under a temporary name and renames it into
 * place once complete, so that a layer file either is whole or is not. */
int layer_create(Store *s, uint64_t id, const LayerCounters *inherit, bool with_root, sqlite3 **ret) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_free_ char *path = NULL, *tmp = NULL;
        LayerCounters c = *inherit;
        int r;

        r = layer_path(s, id, &path);
        if (r < 0)
                return r;
        if (asprintf(&tmp, "%s.new", path) < 0)
                return -ENOMEM;
        (void) unlink(tmp);

        r = sqlite_open(tmp, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, false, &db);
        if (r < 0)
                return r;
        c.stored_bytes = 0;
        if (with_root)
                c.inodes = 1;
        r = sqlite_exec(db, "PRAGMA page_size=4096; BEGIN");
        if (r >= 0)
                r = sqlite_exec(db, layer_schema);
        if (r >= 0)
                r = layer_write_counters(db, &c);
        if (r >= 0 && with_root)
                r = insert_root(db);
        if (r >= 0)
                r = sqlite_commit(db);
        if (r < 0)
                goto fail;
        sqlite3_close_v2(TAKE_PTR(db));

        if (rename(tmp, path) < 0) {
                r = -errno;
                goto fail;
        }
        if (fsync(s->layers_fd) < 0)
                return -errno;
        return layer_open(s, id, LAYER_WRITE, ret);
fail:
        (void) unlink(tmp);
        return r;
}

static bool layer_has_wal(Store *s, uint64_t id);

int layer_open(Store *s, uint64_t id, LayerOpenMode mode, sqlite3 **ret) {
        _cleanup_free_ char *path = NULL, *uri = NULL;
        int r;

        r = layer_exists(s, id);
        if (r < 0)
                return r;
        if (r == 0)
                return -ENOENT;
        r = layer_path(s, id, &path);
        if (r < 0)
                return r;

        /* A frozen layer is sealed before it is frozen; should a WAL be
         * left all the same, immutable would ignore it: read it normally. */
        if (mode == LAYER_READ_FROZEN && layer_has_wal(s, id))
                mode = LAYER_READ;

        switch (mode) {
        case LAYER_WRITE:
                return sqlite_open(path, SQLITE_OPEN_READWRITE, true, ret);
        case LAYER_READ:
                /* Read-write without ever writing: after a writer's crash the
                 * WAL needs recovery, which a read-only connection cannot do. */
                return sqlite_open(path, SQLITE_OPEN_READWRITE, false, ret);
        case LAYER_READ_FROZEN:
                /* A sealed layer never changes and has no journal: immutable
                 * skips all locking. */
                if (asprintf(&uri, "file:%s?immutable=1", path) < 0)
                        return -ENOMEM;
                return sqlite_open(uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, false, ret);
        }
        return -EINVAL;
}

static bool layer_has_wal(Store *s, uint64_t id) {
        struct stat st;
        char name[64];

        layer_file_name(id, "-wal", name);
        return fstatat(s->layers_fd, name, &st, 0) >= 0 && st.st_size > 0;
}

/* The journal mode change needs the database to itself: it does not wait
 * for readers, it reports the mode that stays. So ask until it took. */
static int set_journal_delete(sqlite3 *db) {
        for (unsigned attempt = 0; attempt < SEAL_ATTEMPTS; attempt++) {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                const char *mode;
                int r;

                r = sqlite_prepare(db, "PRAGMA journal_mode=DELETE", &st);
                if (r < 0)
                        return r;
                r = sqlite_step_row(st);
                if (r < 0 && r != -EBUSY)
                        return r;
                mode = r > 0 ? (const char *) sqlite3_column_text(st, 0) : NULL;
                if (mode && streq(mode, "delete"))
                        return 0;
                (void) usleep(SEAL_RETRY_USEC);
        }
        return -EBUSY;
}

int layer_seal(Store *s, uint64_t id) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_free_ char *path = NULL;
        int r;

        r = layer_exists(s, id);
        if (r <= 0)
                return r;
        r = layer_path(s, id, &path);
        if (r < 0)
                return r;
        /* Opened in whatever mode it is in: a WAL left by a crash is
         * recovered first, a sealed layer stays as it is. */
        r = sqlite_open(path, SQLITE_OPEN_READWRITE, false, &db);
        if (r < 0)
                return r;
        return set_journal_delete(db);
}

int layer_stack_counters(Store *s, const uint64_t *ids, size_t n, LayerCounters *ret) {
        for (size_t i = 0; i < n; i++) {
                _cleanup_sqlite_ sqlite3 *db = NULL;
                int r;

                r = layer_open(s, ids[i], LAYER_READ, &db);
                if (r == -ENOENT)
                        continue;
                if (r < 0)
                        return r;
                return layer_read_counters(db, ret);
        }
        return -EUCLEAN; /* every stack has a bottom layer with a root */
}

int layer_unlink(Store *s, uint64_t id) {
        int r = 0;

        FOREACH_STRING(suffix, "", "-wal", "-shm", "-journal", ".new") {
                char name[64];

                layer_file_name(id, suffix, name);
                if (unlinkat(s->layers_fd, name, 0) < 0 && errno != ENOENT)
                        r = -errno;
        }
        return r;
}

uint64_t layer_file_bytes(Store *s, uint64_t id) {
        uint64_t total = 0;

        FOREACH_STRING(suffix, "", "-wal") {
                struct stat st;
                char name[64];

                layer_file_name(id, suffix, name);
                if (fstatat(s->layers_fd, name, &st, 0) >= 0)
                        total += (uint64_t) st.st_blocks * 512;
        }
        return total;
}
