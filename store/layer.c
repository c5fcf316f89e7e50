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
#include "xxhash-util.h"

/* How long a seal waits for readers of the layer to go: 5 s. */
#define SEAL_ATTEMPTS 500
#define SEAL_RETRY_USEC 10000

/* dentries with ino 0 are whiteouts hiding a name of a lower layer; extents
 * with a NULL digest are holes hiding a lower layer's block; lower_limit is
 * the offset from which the lower layers' extents of an inode no longer
 * count (it shrinks on truncate); data holds a small file's content (zstd
 * compressed if data_zstd) or a symlink's target, with data_check, the
 * XXH3-64 of the stored bytes; row_check is each row's check (see
 * store-internal.h). */
/* Inodes without a name, kept while the kernel still used them: found at
 * every writable open without reading every row. */
#define ORPHANS_INDEX "CREATE INDEX IF NOT EXISTS orphans ON inodes(ino) WHERE nlink = 0;"

static const char layer_schema[] =
        "CREATE TABLE info(key TEXT PRIMARY KEY, value INTEGER NOT NULL, row_check INTEGER NOT NULL) WITHOUT ROWID;"
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
        "  data_check INTEGER NOT NULL DEFAULT 0,"
        "  row_check INTEGER NOT NULL);"
        "CREATE TABLE dentries("
        "  parent INTEGER NOT NULL,"
        "  name BLOB NOT NULL,"
        "  ino INTEGER NOT NULL,"
        "  type INTEGER NOT NULL,"
        "  row_check INTEGER NOT NULL,"
        "  PRIMARY KEY (parent, name)) WITHOUT ROWID;"
        "CREATE TABLE xattrs("
        "  ino INTEGER NOT NULL,"
        "  name BLOB NOT NULL,"
        "  value BLOB NOT NULL,"
        "  row_check INTEGER NOT NULL,"
        "  PRIMARY KEY (ino, name)) WITHOUT ROWID;"
        "CREATE TABLE extents("
        "  ino INTEGER NOT NULL,"
        "  idx INTEGER NOT NULL,"
        "  digest BLOB,"
        "  len INTEGER NOT NULL,"
        "  row_check INTEGER NOT NULL,"
        "  PRIMARY KEY (ino, idx)) WITHOUT ROWID;"
        "CREATE TABLE blockrefs("
        "  digest BLOB PRIMARY KEY,"
        "  refs INTEGER NOT NULL,"
        "  stored_len INTEGER NOT NULL,"
        "  row_check INTEGER NOT NULL) WITHOUT ROWID;"
        ORPHANS_INDEX;

/* The tables with row checks, each with the check of its rows. */
static const struct {
        const char *table;
        const char *check;
} checked_tables[] = {
        { "info", INFO_CHECK },
        { "inodes", INODE_CHECK },
        { "dentries", DENTRY_CHECK },
        { "xattrs", XATTR_CHECK },
        { "extents", EXTENT_CHECK },
        { "blockrefs", BLOCKREF_CHECK },
};

/* cowbox_check(...): XXH3-64 over the arguments, each as a type tag and
 * its value (integers as 8 bytes little endian, text and blobs with their
 * length first), so that values cannot run into each other. */
static void sql_row_check(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
        XXH3_state_t *state = sqlite3_user_data(ctx);

        (void) XXH3_64bits_reset(state);
        for (int i = 0; i < argc; i++) {
                uint8_t head[9];
                size_t head_len = 1;
                const void *bytes = NULL;
                uint32_t len = 0;

                switch (sqlite3_value_type(argv[i])) {
                case SQLITE_INTEGER:
                case SQLITE_FLOAT: {
                        uint64_t v = (uint64_t) sqlite3_value_int64(argv[i]);

                        head[0] = 'i';
                        for (unsigned b = 0; b < 8; b++)
                                head[1 + b] = (uint8_t) (v >> (8 * b));
                        head_len = 9;
                        break;
                }
                case SQLITE_TEXT:
                case SQLITE_BLOB:
                        bytes = sqlite3_value_blob(argv[i]);
                        len = (uint32_t) sqlite3_value_bytes(argv[i]);
                        head[0] = 'b';
                        for (unsigned b = 0; b < 4; b++)
                                head[1 + b] = (uint8_t) (len >> (8 * b));
                        head_len = 5;
                        break;
                default:
                        head[0] = 'n';
                        break;
                }
                (void) XXH3_64bits_update(state, head, head_len);
                if (len > 0)
                        (void) XXH3_64bits_update(state, bytes, len);
        }
        sqlite3_result_int64(ctx, (sqlite3_int64) XXH3_64bits_digest(state));
}

static void free_check_state(void *p) {
        (void) XXH3_freeState(p);
}

/* A connection is used by one thread at a time: it gets its own state. */
int row_check_register(sqlite3 *db) {
        XXH3_state_t *state = XXH3_createState();

        if (!state)
                return -ENOMEM;
        return sqlite_errno(sqlite3_create_function_v2(db, "cowbox_check", -1,
                                                       SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS,
                                                       state, sql_row_check, NULL, NULL, free_check_state));
}

static int layer_connect(const char *path, int flags, bool wal, sqlite3 **ret) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        int r;

        r = sqlite_open(path, flags, wal, &db);
        if (r < 0)
                return r;
        r = row_check_register(db);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(db);
        return 0;
}

bool layer_has_row_checks(sqlite3 *db, const char *schema) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_free_ char *sql = NULL;

        if (asprintf(&sql, "SELECT row_check FROM \"%s\".inodes LIMIT 0", schema) < 0)
                return false;
        return sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK;
}

int layer_count_damaged_rows(sqlite3 *db, const char *schema, int64_t *ret) {
        int64_t total = 0;

        if (!layer_has_row_checks(db, schema)) {
                *ret = 0;
                return 0;
        }
        for (size_t i = 0; i < ELEMENTSOF(checked_tables); i++) {
                _cleanup_free_ char *sql = NULL;
                int64_t n = 0;
                int r;

                if (asprintf(&sql, "SELECT count(*) FROM \"%s\".%s WHERE row_check IS NOT %s", schema,
                             checked_tables[i].table, checked_tables[i].check) < 0)
                        return -ENOMEM;
                r = sqlite_query_int(db, sql, &n);
                if (r < 0)
                        return r;
                total += n;
        }
        *ret = total;
        return 0;
}

/* Gives a layer written before row checks its checks, in one transaction. */
static int add_row_checks(sqlite3 *db) {
        int r;

        if (layer_has_row_checks(db, "main"))
                return 0;
        r = sqlite_begin(db);
        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(checked_tables); i++) {
                _cleanup_free_ char *sql = NULL;

                if (asprintf(&sql, "ALTER TABLE %1$s ADD COLUMN row_check INTEGER NOT NULL DEFAULT 0;"
                                   "UPDATE %1$s SET row_check = %2$s;",
                             checked_tables[i].table, checked_tables[i].check) < 0)
                        r = -ENOMEM;
                else
                        r = sqlite_exec(db, sql);
        }
        if (r >= 0)
                r = sqlite_commit(db);
        if (r < 0)
                sqlite_rollback(db);
        return r;
}

int layer_path(Store *s, uint64_t id, char **ret) {
        /* Through the store's own descriptor of its layers' directory: a
         * store moved while it is open keeps its layers, and another made
         * at its old path is none of its business. */
        return asprintf(ret, "/proc/self/fd/%d/%" PRIu64 ".db", s->layers_fd, id) < 0 ? -ENOMEM : 0;
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

int layer_highest_ino(sqlite3 *db, uint64_t *ret) {
        int64_t v = 0;
        int r;

        r = sqlite_query_int(db, "SELECT coalesce(max(ino), 0) FROM inodes", &v);
        if (r < 0)
                return r;
        *ret = (uint64_t) v;
        return 0;
}

int layer_write_counters(sqlite3 *db, const LayerCounters *c) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(db, "INSERT OR REPLACE INTO info(key, value, row_check) VALUES "
                               "('next_ino', ?1, cowbox_check('info', 'next_ino', ?1)),"
                               "('logical_bytes', ?2, cowbox_check('info', 'logical_bytes', ?2)),"
                               "('inodes', ?3, cowbox_check('info', 'inodes', ?3)),"
                               "('stored_bytes', ?4, cowbox_check('info', 'stored_bytes', ?4))", &st);
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
        r = sqlite_prepare(db, layer_has_row_checks(db, "main") ? "SELECT key, value, row_check IS " INFO_CHECK " FROM info"
                                                                : "SELECT key, value, 1 FROM info", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                const char *key = (const char *) sqlite3_column_text(st, 0);
                uint64_t v = (uint64_t) sqlite3_column_int64(st, 1);

                if (!sqlite3_column_int(st, 2))
                        return -EIO;
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
                               "ctime_ns, parent, lower_limit, data, row_check) VALUES (1, ?1, 2, 0, 0, 0, 0, ?2, ?2, ?2, 1, 0, "
                               "NULL, cowbox_check('inode', 1, ?1, 2, 0, 0, 0, 0, ?2, ?2, ?2, 1, 0, 0, 0))",
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

        *ret = NULL;
        r = layer_path(s, id, &path);
        if (r < 0)
                return r;
        if (asprintf(&tmp, "%s.new", path) < 0)
                return -ENOMEM;
        (void) unlink(tmp);

        r = layer_connect(tmp, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, false, &db);
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
        r = fsync(s->layers_fd) < 0 ? -errno : layer_open(s, id, LAYER_WRITE, ret);
        /* From now on its absence is a loss, not an empty layer. A crash
         * before this leaves a database the catalog does not know was
         * made: read as it is, like any. */
        if (r >= 0)
                r = catalog_layer_set_made(s, id);
        if (r < 0) {
                if (*ret)
                        sqlite3_close_v2(*ret);
                *ret = NULL;
                (void) layer_unlink(s, id); /* whole and opened, or not there */
        }
        return r;
fail:
        (void) unlink(tmp);
        return r;
}

static bool layer_has_wal(Store *s, uint64_t id);

/* SQLite reads a database only at its first statement: one whose header is
 * damaged, or that was cut to nothing (an empty database to SQLite), is
 * found here, at its opening, as damage (EUCLEAN), by whoever opens it. */
static int layer_check_readable(sqlite3 *db) {
        int64_t tables = 0;
        int r;

        r = sqlite_query_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'inodes'",
                             &tables);
        if (r < 0)
                return r;
        return tables == 1 ? 0 : -EUCLEAN;
}

/* Never made: an empty layer. Made and gone: lost, and nothing may take it
 * for empty (the reaper would free the blocks it names). Removed by the
 * reaper, its record first: gone, as if never made. */
static int layer_absent(Store *s, uint64_t id) {
        int r;

        r = catalog_layer_was_made(s, id);
        if (r < 0)
                return r;
        return r > 0 ? -EUCLEAN : -ENOENT;
}

static int layer_open_file(Store *s, uint64_t id, LayerOpenMode mode, sqlite3 **ret);

int layer_open(Store *s, uint64_t id, LayerOpenMode mode, sqlite3 **ret) {
        int r;

        r = layer_exists(s, id);
        if (r < 0)
                return r;
        if (r == 0)
                return layer_absent(s, id);
        r = layer_open_file(s, id, mode, ret);
        /* Removed between the look and the first read, which opens the
         * journal next to the database by its name (SQLite then reports
         * a failed stat as an I/O error): gone, as if not found. */
        if (r < 0 && r != -EUCLEAN && layer_exists(s, id) == 0)
                return layer_absent(s, id);
        return r;
}

static int layer_open_file(Store *s, uint64_t id, LayerOpenMode mode, sqlite3 **ret) {
        _cleanup_free_ char *path = NULL, *uri = NULL;
        int r;

        r = layer_path(s, id, &path);
        if (r < 0)
                return r;

        /* A frozen layer is sealed before it is frozen; should a WAL be
         * left all the same, immutable would ignore it: read it normally. */
        if (mode == LAYER_READ_FROZEN && layer_has_wal(s, id))
                mode = LAYER_READ;

        switch (mode) {
        case LAYER_WRITE: {
                _cleanup_sqlite_ sqlite3 *db = NULL;

                r = layer_connect(path, SQLITE_OPEN_READWRITE, true, &db);
                if (r >= 0)
                        r = layer_check_readable(db);
                if (r >= 0)
                        r = add_row_checks(db);
                if (r >= 0)
                        r = sqlite_exec(db, ORPHANS_INDEX); /* layers made before it had none */
                if (r < 0)
                        return r;
                *ret = TAKE_PTR(db);
                return 0;
        }
        case LAYER_READ:
                /* Read-write without ever writing: after a writer's crash the
                 * WAL needs recovery, which a read-only connection cannot do. */
                r = layer_connect(path, SQLITE_OPEN_READWRITE, false, ret);
                break;
        case LAYER_READ_FROZEN:
                /* A sealed layer never changes and has no journal: immutable
                 * skips all locking. */
                if (asprintf(&uri, "file:%s?immutable=1", path) < 0)
                        return -ENOMEM;
                r = layer_connect(uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, false, ret);
                break;
        default:
                return -EINVAL;
        }
        if (r >= 0 && (r = layer_check_readable(*ret)) < 0) {
                sqlite3_close_v2(*ret);
                *ret = NULL;
        }
        return r;
}

static bool layer_has_wal(Store *s, uint64_t id) {
        struct stat st;
        char name[64];

        layer_file_name(id, "-wal", name);
        return fstatat(s->layers_fd, name, &st, 0) >= 0 && st.st_size > 0;
}

/* The journal mode change needs the database to itself: it does not wait
 * for readers, it reports the mode that stays. So ask until it took. */
int layer_journal_delete(sqlite3 *db) {
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
        /* The last connection to close checkpoints the WAL into the
         * database, syncs it and removes the WAL: without WAL frames the
         * file is complete, and immutable readers read it as it is, its
         * header still naming WAL mode. Leaving that mode would cost a
         * rollback journal and four syncs in every first snapshot. */
        if (!layer_has_wal(s, id))
                return 0;
        r = layer_path(s, id, &path);
        if (r < 0)
                return r;
        /* Opened in whatever mode it is in: a WAL left by a crash, or kept
         * by another connection still open, is checkpointed first. */
        r = sqlite_open(path, SQLITE_OPEN_READWRITE, false, &db);
        if (r < 0)
                return r;
        return layer_journal_delete(db);
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
