/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The catalog: subvolumes, the tree of layers, the block index. */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc-util.h"
#include "fd-util.h"
#include "process-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "string-util.h"

/* Columns added after the first format: what a send stream says of an
 * image (the sender's UUID and transaction id) and the subvolume's own
 * transaction id. A store made before them gets them at open. */
#define SUBVOLUME_IMAGE_COLUMNS_SQL                        \
        "  received_uuid TEXT NOT NULL DEFAULT '',"        \
        "  ctransid INTEGER NOT NULL DEFAULT 0,"           \
        "  stransid INTEGER NOT NULL DEFAULT 0"

/* zstd dictionaries by their zstd ID, with the XXH3-64 of their content. */
#define DICTIONARIES_SCHEMA                                                                             \
        "CREATE TABLE IF NOT EXISTS dictionaries(dict_id INTEGER PRIMARY KEY, content BLOB NOT NULL,"  \
        "  content_check INTEGER NOT NULL, created_usec INTEGER NOT NULL);"

/* Whether a layer's database was made: a layer gets its database lazily
 * (a writable top at its first change), so a missing one is an empty layer
 * unless this says it was made, and then it is lost. */
#define LAYER_MADE_COLUMN_SQL "  made INTEGER NOT NULL DEFAULT 0"

/* Blocks whose record was found damaged: a write of the same bytes stores
 * them anew instead of referencing the damaged record, and the index then
 * names the new one (block_commit()). */
#define DAMAGED_BLOCKS_SCHEMA "CREATE TABLE IF NOT EXISTS damaged_blocks(digest BLOB PRIMARY KEY) WITHOUT ROWID;"

/* Every snapshot looks its UUID up (check_uuid_free()), and receives find
 * their parents by UUID: without it, a scan of every subvolume, deleted
 * ones too. */
#define SUBVOLUMES_UUID_INDEX_SQL "CREATE INDEX IF NOT EXISTS subvolumes_uuid ON subvolumes(uuid);"

/* Whether a layer is shared (catalog_layer_is_shared()) is found by
 * walking down from it to the tops of live subvolumes: without it, a scan
 * of every subvolume for each layer of a stack. */
#define SUBVOLUMES_TOP_INDEX_SQL \
        "CREATE INDEX IF NOT EXISTS subvolumes_live_top ON subvolumes(top_layer) WHERE deleted = 0;"

/* The checks of the rows of subvolumes and layers (see SUBVOLUME_CHECK),
 * computed by triggers from the row as written. */
#define CHECKED_COLUMN_SQL "  row_check INTEGER NOT NULL DEFAULT 0"
#define SUBVOLUME_CHECKED_COLUMNS \
        "id, name, uuid, parent_uuid, readonly, created_usec, top_layer, quota_bytes, deleted, " \
        "received_uuid, ctransid, stransid"
/* A change of a row damaged already is refused (SQLITE_CONSTRAINT_TRIGGER,
 * -EUCLEAN): its check computed anew would pass the damage for sound. */
#define CATALOG_CHECK_TRIGGERS_SQL                                                                       \
        "CREATE TRIGGER IF NOT EXISTS subvolumes_checked_insert AFTER INSERT ON subvolumes BEGIN"       \
        "  UPDATE subvolumes SET row_check = " SUBVOLUME_CHECK " WHERE id = NEW.id; END;"              \
        "CREATE TRIGGER IF NOT EXISTS subvolumes_sound_update"                                          \
        "  BEFORE UPDATE OF " SUBVOLUME_CHECKED_COLUMNS " ON subvolumes"                                \
        "  WHEN OLD.row_check IS NOT " SUBVOLUME_CHECK_OF("OLD.") " BEGIN"                              \
        "  SELECT RAISE(ABORT, 'damaged record'); END;"                                                 \
        "CREATE TRIGGER IF NOT EXISTS subvolumes_checked_update"                                        \
        "  AFTER UPDATE OF " SUBVOLUME_CHECKED_COLUMNS " ON subvolumes BEGIN"                           \
        "  UPDATE subvolumes SET row_check = " SUBVOLUME_CHECK " WHERE id = NEW.id; END;"              \
        "CREATE TRIGGER IF NOT EXISTS layers_checked_insert AFTER INSERT ON layers BEGIN"               \
        "  UPDATE layers SET row_check = " LAYER_CHECK_OF("layers.") " WHERE id = NEW.id; END;"        \
        "CREATE TRIGGER IF NOT EXISTS layers_sound_update"                                              \
        "  BEFORE UPDATE OF id, parent, created_usec, made ON layers"                                   \
        "  WHEN OLD.row_check IS NOT " LAYER_CHECK_OF("OLD.") " BEGIN"                                  \
        "  SELECT RAISE(ABORT, 'damaged record'); END;"                                                 \
        "CREATE TRIGGER IF NOT EXISTS layers_checked_update"                                            \
        "  AFTER UPDATE OF id, parent, created_usec, made ON layers BEGIN"                              \
        "  UPDATE layers SET row_check = " LAYER_CHECK_OF("layers.") " WHERE id = NEW.id; END;"

/* The same for the rows of a table keyed by key_column. INSERT OR REPLACE
 * writes a row anew: it mends a damaged one. */
#define CHECK_TRIGGERS_SQL(table, key_column, columns, check_of)                                         \
        "CREATE TRIGGER IF NOT EXISTS " table "_checked_insert AFTER INSERT ON " table " BEGIN"          \
        "  UPDATE " table " SET row_check = " check_of(table ".") " WHERE " key_column " = NEW."         \
        key_column "; END;"                                                                             \
        "CREATE TRIGGER IF NOT EXISTS " table "_sound_update BEFORE UPDATE OF " columns " ON " table     \
        "  WHEN OLD.row_check IS NOT " check_of("OLD.") " BEGIN"                                        \
        "  SELECT RAISE(ABORT, 'damaged record'); END;"                                                 \
        "CREATE TRIGGER IF NOT EXISTS " table "_checked_update AFTER UPDATE OF " columns " ON " table    \
        " BEGIN UPDATE " table " SET row_check = " check_of(table ".") " WHERE " key_column " = NEW."    \
        key_column "; END;"

#define OTHER_CHECK_TRIGGERS_SQL                                                                        \
        CHECK_TRIGGERS_SQL("meta", "key", "key, value", META_CHECK_OF)                                  \
        CHECK_TRIGGERS_SQL("counters", "key", "key, value", COUNTER_CHECK_OF)                           \
        CHECK_TRIGGERS_SQL("packs", "id", "id, created_usec", PACK_CHECK_OF)

static const char catalog_schema[] =
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value," CHECKED_COLUMN_SQL ");"
        "CREATE TABLE layers("
        "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
        "  parent INTEGER REFERENCES layers(id),"
        "  created_usec INTEGER NOT NULL,"
        LAYER_MADE_COLUMN_SQL ","
        CHECKED_COLUMN_SQL ");"
        "CREATE INDEX layers_parent ON layers(parent);"
        "CREATE TABLE subvolumes("
        "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
        "  name TEXT NOT NULL,"
        "  uuid TEXT NOT NULL,"
        "  parent_uuid TEXT NOT NULL DEFAULT '',"
        "  readonly INTEGER NOT NULL,"
        "  created_usec INTEGER NOT NULL,"
        "  top_layer INTEGER NOT NULL REFERENCES layers(id),"
        "  quota_bytes INTEGER NOT NULL DEFAULT 0,"
        "  deleted INTEGER NOT NULL DEFAULT 0,"
        SUBVOLUME_IMAGE_COLUMNS_SQL ","
        CHECKED_COLUMN_SQL ");"
        "CREATE UNIQUE INDEX subvolumes_live_name ON subvolumes(name) WHERE deleted = 0;"
        SUBVOLUMES_UUID_INDEX_SQL
        SUBVOLUMES_TOP_INDEX_SQL
        "CREATE TABLE packs(id INTEGER PRIMARY KEY AUTOINCREMENT, created_usec INTEGER NOT NULL,"
        CHECKED_COLUMN_SQL ");"
        "CREATE TABLE blocks("
        "  digest BLOB PRIMARY KEY,"
        "  pack INTEGER NOT NULL,"
        "  offset INTEGER NOT NULL,"
        "  stored_len INTEGER NOT NULL,"
        "  raw_len INTEGER NOT NULL) WITHOUT ROWID;"
        DAMAGED_BLOCKS_SCHEMA
        "CREATE TABLE counters(key TEXT PRIMARY KEY, value INTEGER NOT NULL," CHECKED_COLUMN_SQL ");"
        DICTIONARIES_SCHEMA
        CATALOG_CHECK_TRIGGERS_SQL
        OTHER_CHECK_TRIGGERS_SQL
        "INSERT INTO counters(key, value) VALUES ('corruption_events', 0), ('transid', 0);";

/* The layers reachable from the tops of live subvolumes. */
#define LIVE_LAYERS_CTE                                                                \
        "WITH RECURSIVE live(layer) AS ("                                              \
        "  SELECT top_layer FROM subvolumes WHERE deleted = 0"                         \
        "  UNION SELECT layers.parent FROM live JOIN layers ON layers.id = live.layer" \
        "  WHERE layers.parent IS NOT NULL) "

int catalog_create_schema(sqlite3 *db) {
        return sqlite_exec(db, catalog_schema);
}

static bool has_column(sqlite3 *db, const char *table, const char *column) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        char sql[128];

        snprintf(sql, sizeof sql, "SELECT %s FROM %s LIMIT 0", column, table);
        return sqlite_prepare(db, sql, &st) >= 0;
}

/* 1 if the schema has an index or trigger (type) of this name. */
static int schema_has(sqlite3 *db, const char *type, const char *name) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(db, "SELECT 1 FROM sqlite_master WHERE type = ?1 AND name = ?2", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        return sqlite_step_row(st);
}

/* Indexes added since the first stores were made. */
static int add_index(sqlite3 *db, const char *name, const char *sql) {
        int r;

        r = schema_has(db, "index", name);
        if (r != 0)
                return r < 0 ? r : 0;
        return sqlite_exec(db, sql);
}

/* Runs an upgrade step in one transaction, unless done says another
 * process did it meanwhile. */
static int upgrade_step(Store *s, bool (*done)(sqlite3 *db), int (*apply)(Store *s)) {
        int r;

        r = sqlite_exec(s->catalog, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if (!done(s->catalog))
                r = apply(s);
        if (r >= 0)
                r = sqlite_commit(s->catalog);
        if (r < 0)
                sqlite_rollback(s->catalog);
        return r;
}

static bool layers_say_made(sqlite3 *db) {
        return has_column(db, "layers", "made");
}

/* Layers of a store made before they said whether their database was
 * made: those whose file is there now were. */
static int add_layers_made(Store *s) {
        _cleanup_stmt_ sqlite3_stmt *ids = NULL, *mark = NULL;
        int r;

        r = sqlite_exec(s->catalog, "ALTER TABLE layers ADD COLUMN" LAYER_MADE_COLUMN_SQL);
        if (r >= 0)
                r = sqlite_prepare(s->catalog, "SELECT id FROM layers", &ids);
        if (r >= 0)
                r = sqlite_prepare(s->catalog, "UPDATE layers SET made = 1 WHERE id = ?1", &mark);
        while (r >= 0 && (r = sqlite_step_row(ids)) > 0) {
                uint64_t id = (uint64_t) sqlite3_column_int64(ids, 0);

                r = layer_exists(s, id);
                if (r > 0) {
                        sqlite3_reset(mark);
                        sqlite3_bind_int64(mark, 1, (sqlite3_int64) id);
                        r = sqlite_step_done(mark);
                }
        }
        return r;
}

static bool row_checks_kept(sqlite3 *db) {
        return has_column(db, "subvolumes", "row_check");
}

/* Checks for the rows of a store made before them. */
static int add_row_checks(Store *s) {
        return sqlite_exec(s->catalog,
                           "ALTER TABLE subvolumes ADD COLUMN" CHECKED_COLUMN_SQL ";"
                           "ALTER TABLE layers ADD COLUMN" CHECKED_COLUMN_SQL ";"
                           CATALOG_CHECK_TRIGGERS_SQL
                           "UPDATE subvolumes SET row_check = " SUBVOLUME_CHECK ";"
                           "UPDATE layers SET row_check = " LAYER_CHECK_OF("layers.") ";");
}

/* Whether the catalog's other rows have their checks, kept by triggers. */
static bool other_row_checks_kept(sqlite3 *db) {
        return has_column(db, "meta", "row_check") && schema_has(db, "trigger", "packs_checked_update") > 0;
}

/* Checks for the catalog's other rows, of a store made before them: the
 * columns, the triggers, and the checks of the rows as they are. */
static int add_other_row_checks(Store *s) {
        int r = 0;

        FOREACH_STRING(table, "meta", "counters", "packs")
                if (r >= 0 && !has_column(s->catalog, table, "row_check")) {
                        _cleanup_free_ char *sql = NULL;

                        if (asprintf(&sql, "ALTER TABLE %s ADD COLUMN" CHECKED_COLUMN_SQL, table) < 0)
                                r = -ENOMEM;
                        else
                                r = sqlite_exec(s->catalog, sql);
                }
        if (r < 0)
                return r;
        return sqlite_exec(s->catalog,
                           OTHER_CHECK_TRIGGERS_SQL
                           "UPDATE meta SET row_check = " META_CHECK_OF("meta.") ";"
                           "UPDATE counters SET row_check = " COUNTER_CHECK_OF("counters.") ";"
                           "UPDATE packs SET row_check = " PACK_CHECK_OF("packs.") ";");
}

/* The first triggers of the checks computed them anew from any row, also
 * from one damaged already, which a change of it then passed for sound. */
static bool check_triggers_current(sqlite3 *db) {
        return schema_has(db, "trigger", "subvolumes_sound_update") > 0;
}

static int add_check_triggers(Store *s) {
        return sqlite_exec(s->catalog, CATALOG_CHECK_TRIGGERS_SQL);
}

/* Programs of the format before could not write this one (they lack the
 * function of the checks): it says so, and they refuse to open it. */
static int upgrade_format(Store *s) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int64_t format = 0;
        int r;

        /* Read first: a store opened while another process writes to its
         * catalog must not wait for it. */
        r = sqlite_query_int(s->catalog, "SELECT value FROM meta WHERE key = 'format'", &format);
        if (r < 0 || format >= STORE_FORMAT_VERSION)
                return r;
        r = sqlite_prepare(s->catalog, "UPDATE meta SET value = ?1 WHERE key = 'format' AND value < ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int(st, 1, STORE_FORMAT_VERSION);
        return sqlite_step_done(st);
}

int catalog_upgrade(Store *s) {
        sqlite3 *db = s->catalog;
        int r;

        CATALOG_LOCKED(s);
        if (!has_column(db, "dictionaries", "dict_id")) {
                r = sqlite_exec(db, DICTIONARIES_SCHEMA);
                if (r < 0)
                        return r;
        }
        if (!has_column(db, "subvolumes", "received_uuid")) {
                r = sqlite_exec(db,
                                "BEGIN IMMEDIATE;"
                                "ALTER TABLE subvolumes ADD COLUMN received_uuid TEXT NOT NULL DEFAULT '';"
                                "ALTER TABLE subvolumes ADD COLUMN ctransid INTEGER NOT NULL DEFAULT 0;"
                                "ALTER TABLE subvolumes ADD COLUMN stransid INTEGER NOT NULL DEFAULT 0;"
                                "INSERT OR IGNORE INTO counters(key, value) VALUES ('transid', 0);"
                                "COMMIT");
                if (r < 0)
                        return r;
        }
        r = add_index(db, "subvolumes_uuid", SUBVOLUMES_UUID_INDEX_SQL);
        if (r < 0)
                return r;
        r = add_index(db, "subvolumes_live_top", SUBVOLUMES_TOP_INDEX_SQL);
        if (r < 0)
                return r;
        if (!has_column(db, "damaged_blocks", "digest")) {
                r = sqlite_exec(db, DAMAGED_BLOCKS_SCHEMA);
                if (r < 0)
                        return r;
        }
        /* Each asked first without a transaction: a store opened while
         * another process writes to its catalog must not wait for it. */
        if (!layers_say_made(db)) {
                r = upgrade_step(s, layers_say_made, add_layers_made);
                if (r < 0)
                        return r;
        }
        if (!row_checks_kept(db))
                r = upgrade_step(s, row_checks_kept, add_row_checks);
        else if (!check_triggers_current(db))
                r = upgrade_step(s, check_triggers_current, add_check_triggers);
        if (r >= 0 && !other_row_checks_kept(db))
                r = upgrade_step(s, other_row_checks_kept, add_other_row_checks);
        if (r < 0)
                return r;
        return upgrade_format(s);
}

int catalog_layer_set_made(Store *s, uint64_t id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "UPDATE layers SET made = 1 WHERE id = ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) id);
        return sqlite_step_done(st);
}

int catalog_layer_was_made(Store *s, uint64_t id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT made FROM layers WHERE id = ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) id);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r;
        return sqlite3_column_int64(st, 0) != 0;
}

int catalog_next_transid(Store *s, uint64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog,
                           "UPDATE counters SET value = value + 1 WHERE key = 'transid' RETURNING value", &st);
        if (r < 0)
                return r;
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        if (r == 0)
                return -EUCLEAN;
        *ret = (uint64_t) sqlite3_column_int64(st, 0);
        return 0;
}

void subvolume_record_clear(SubvolumeRecord *r) {
        free(r->name);
        r->name = NULL;
}

/* A damaged row is not used: its top layer could be another's. Listings
 * name it themselves. */
static int subvolume_record_from_row(sqlite3_stmt *st, SubvolumeRecord *ret) {
        if (!sqlite3_column_int(st, 11)) {
                *ret = (SubvolumeRecord) {};
                return -EUCLEAN;
        }
        *ret = (SubvolumeRecord) {
                .id = (uint64_t) sqlite3_column_int64(st, 0),
                .readonly = sqlite3_column_int(st, 4),
                .created_usec = (uint64_t) sqlite3_column_int64(st, 5),
                .top_layer = (uint64_t) sqlite3_column_int64(st, 6),
                .quota_bytes = (uint64_t) sqlite3_column_int64(st, 7),
                .ctransid = (uint64_t) sqlite3_column_int64(st, 9),
                .stransid = (uint64_t) sqlite3_column_int64(st, 10),
        };
        ret->name = strdup((const char *) sqlite3_column_text(st, 1));
        if (!ret->name)
                return -ENOMEM;
        snprintf(ret->uuid, sizeof ret->uuid, "%s", (const char *) sqlite3_column_text(st, 2));
        snprintf(ret->parent_uuid, sizeof ret->parent_uuid, "%s", (const char *) sqlite3_column_text(st, 3));
        snprintf(ret->received_uuid, sizeof ret->received_uuid, "%s", (const char *) sqlite3_column_text(st, 8));
        return 0;
}

#define SUBVOLUME_COLUMNS \
        "id, name, uuid, parent_uuid, readonly, created_usec, top_layer, quota_bytes, " \
        "received_uuid, ctransid, stransid, row_check IS " SUBVOLUME_CHECK

static int find_subvolume(Store *s, const char *sql, const char *name, uint64_t id, SubvolumeRecord *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, sql, &st);
        if (r < 0)
                return r;
        if (name)
                sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        else
                sqlite3_bind_int64(st, 1, (sqlite3_int64) id);
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        if (r == 0)
                return -ENOENT;
        r = subvolume_record_from_row(st, ret);
        if (r == -EUCLEAN)
                store_log("the catalog's record of subvolume %" PRIi64 " is damaged: it is not used. "
                          "'cowbox-store scrub' names it", (int64_t) sqlite3_column_int64(st, 0));
        return r;
}

int catalog_find_subvolume(Store *s, const char *name, SubvolumeRecord *ret) {
        return find_subvolume(s, "SELECT " SUBVOLUME_COLUMNS " FROM subvolumes WHERE name = ?1 AND deleted = 0",
                              name, 0, ret);
}

int catalog_find_subvolume_by_id(Store *s, uint64_t id, SubvolumeRecord *ret) {
        return find_subvolume(s, "SELECT " SUBVOLUME_COLUMNS " FROM subvolumes WHERE id = ?1 AND deleted = 0",
                              NULL, id, ret);
}

int catalog_find_subvolume_by_uuid(Store *s, const char *uuid, bool received, SubvolumeRecord *ret) {
        if (received)
                return find_subvolume(s, "SELECT " SUBVOLUME_COLUMNS " FROM subvolumes "
                                         "WHERE received_uuid = ?1 AND deleted = 0 ORDER BY id DESC LIMIT 1",
                                      uuid, 0, ret);
        return find_subvolume(s, "SELECT " SUBVOLUME_COLUMNS " FROM subvolumes WHERE uuid = ?1 AND deleted = 0",
                              uuid, 0, ret);
}

int catalog_subvolume_names(Store *s, char ***ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_strv_free_ char **names = NULL;
        size_t n = 0, allocated = 0;
        int r;

        if (!GREEDY_REALLOC(names, allocated, 1))
                return -ENOMEM;
        names[0] = NULL;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT name FROM subvolumes WHERE deleted = 0 ORDER BY name", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(names, allocated, n + 2))
                        return -ENOMEM;
                names[n] = strdup((const char *) sqlite3_column_text(st, 0));
                if (!names[n])
                        return -ENOMEM;
                names[++n] = NULL;
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(names);
        return 0;
}

/* A damaged record in a listing: its id, and its name as it stands, so that
 * it can be named and deleted. */
static int damaged_subvolume_record_from_row(sqlite3_stmt *st, SubvolumeRecord *ret) {
        const char *name = (const char *) sqlite3_column_text(st, 1);

        *ret = (SubvolumeRecord) {
                .id = (uint64_t) sqlite3_column_int64(st, 0),
                .damaged = true,
        };
        ret->name = strdup(name ?: "");
        return ret->name ? 0 : -ENOMEM;
}

int catalog_list_subvolumes(Store *s, bool skip_damaged, SubvolumeRecord **ret, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        SubvolumeRecord *recs = NULL;
        size_t n = 0, allocated = 0;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT " SUBVOLUME_COLUMNS " FROM subvolumes WHERE deleted = 0 ORDER BY name", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(recs, allocated, n + 1)) {
                        r = -ENOMEM;
                        break;
                }
                r = subvolume_record_from_row(st, &recs[n]);
                if (r == -EUCLEAN && skip_damaged)
                        continue;
                if (r == -EUCLEAN)
                        r = damaged_subvolume_record_from_row(st, &recs[n]);
                if (r < 0)
                        break;
                n++;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        subvolume_record_clear(&recs[i]);
                free(recs);
                return r;
        }
        *ret = recs;
        *ret_n = n;
        return 0;
}

/* The stack that seed_sql's first layer (bound to ?1) stands on, in one
 * statement, one snapshot of the catalog: walked a query a layer, a fold
 * committed between two of them left a parent without its row, which
 * looked like damage. */
static int layer_stack_read(Store *s, const char *seed_sql, uint64_t key, uint64_t **ret_ids, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_free_ char *sql = NULL;
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0, allocated = 0;
        bool bottom = false;
        int r;

        if (asprintf(&sql,
                     "WITH RECURSIVE stack(id, parent, depth, sound) AS (%s"
                     "  UNION ALL SELECT layers.id, layers.parent, stack.depth + 1,"
                     "  layers.row_check IS " LAYER_CHECK_OF("layers.")
                     "  FROM layers JOIN stack ON layers.id = stack.parent WHERE stack.depth < 100000) "
                     "SELECT id, parent IS NULL, sound FROM stack ORDER BY depth", seed_sql) < 0)
                return -ENOMEM;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, sql, &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) key);
        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(ids, allocated, n + 1))
                        return -ENOMEM;
                ids[n++] = (uint64_t) sqlite3_column_int64(st, 0);
                bottom = sqlite3_column_int(st, 1);
                if (!sqlite3_column_int(st, 2)) {
                        store_log("the catalog's record of layer %" PRIu64 ", or of the subvolume on it, is "
                                  "damaged: it is not used. 'cowbox-store scrub' names it", ids[n - 1]);
                        return -EUCLEAN;
                }
        }
        if (r < 0)
                return r;
        /* A layer without its row, or a loop in the tree: never made by us. */
        if (!bottom)
                return -EUCLEAN;

        *ret_ids = TAKE_PTR(ids);
        *ret_n = n;
        return 0;
}

int catalog_layer_stack(Store *s, uint64_t top, uint64_t **ret_ids, size_t *ret_n) {
        return layer_stack_read(s, "SELECT id, parent, 0, row_check IS " LAYER_CHECK_OF("layers.")
                                   " FROM layers WHERE id = ?1", top, ret_ids, ret_n);
}

int catalog_stack_damaged_layer(Store *s, uint64_t top, uint64_t *ret_layer) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        /* A damaged record's parent may be anything: the walk ends at the
         * first one, or after as many layers as a stack may have. */
        r = sqlite_prepare(s->catalog,
                           "WITH RECURSIVE stack(id, parent, depth, sound) AS ("
                           "  SELECT id, parent, 0, row_check IS " LAYER_CHECK_OF("layers.") " FROM layers WHERE id = ?1"
                           "  UNION ALL SELECT layers.id, layers.parent, stack.depth + 1,"
                           "  layers.row_check IS " LAYER_CHECK_OF("layers.")
                           "  FROM layers JOIN stack ON layers.id = stack.parent WHERE stack.sound AND stack.depth < 100000) "
                           "SELECT id FROM stack WHERE NOT sound LIMIT 1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) top);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r;
        *ret_layer = (uint64_t) sqlite3_column_int64(st, 0);
        return 1;
}

int catalog_subvolume_stack(Store *s, uint64_t id, uint64_t **ret_ids, size_t *ret_n) {
        int r;

        r = layer_stack_read(s, "SELECT id, parent, 0, row_check IS " LAYER_CHECK_OF("layers.") " AND "
                                "(SELECT row_check IS " SUBVOLUME_CHECK " FROM subvolumes WHERE id = ?1) "
                                "FROM layers WHERE id = (SELECT top_layer FROM subvolumes WHERE id = ?1)",
                             id, ret_ids, ret_n);
        if (r != -EUCLEAN)
                return r;
        /* No rows at all: no such subvolume, or its top is lost. */
        r = catalog_id_known(s, "subvolumes", id);
        if (r < 0)
                return r;
        return r > 0 ? -EUCLEAN : -ENOENT;
}

int catalog_damaged_subvolume_id(Store *s, const char *name, uint64_t *ret_id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT id FROM subvolumes WHERE name = ?1 "
                                       "AND row_check IS NOT " SUBVOLUME_CHECK " LIMIT 1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -ENOENT;
        *ret_id = (uint64_t) sqlite3_column_int64(st, 0);
        return 0;
}

int catalog_subvolume_is_damaged(Store *s, uint64_t id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT 1 FROM subvolumes WHERE id = ?1 AND row_check IS NOT " SUBVOLUME_CHECK,
                           &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) id);
        return sqlite_step_row(st);
}

int catalog_remove_damaged_subvolume(Store *s, uint64_t id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "DELETE FROM subvolumes WHERE id = ?1 AND row_check IS NOT " SUBVOLUME_CHECK,
                           &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) id);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        return sqlite3_changes(s->catalog) > 0 ? 0 : -ENOENT;
}

void catalog_damage_array_free(CatalogDamage *d, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(d[i].name);
        free(d);
}

int catalog_damaged_records(Store *s, bool live_only, CatalogDamage **ret, size_t *ret_n, uint64_t *ret_checked) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        CatalogDamage *d = NULL;
        size_t n = 0, allocated = 0;
        int64_t checked = 0;
        int r;

        CATALOG_LOCKED(s);
        /* live_only is for the reaper, whose work follows from the records
         * of subvolumes and layers; it passes damaged packs by itself. */
        r = sqlite_prepare(s->catalog,
                           live_only ? LIVE_LAYERS_CTE
                                       "SELECT 0, id, name FROM subvolumes WHERE row_check IS NOT " SUBVOLUME_CHECK
                                       " UNION ALL SELECT 1, id, NULL FROM layers WHERE row_check IS NOT "
                                       LAYER_CHECK_OF("layers.") " AND id IN (SELECT layer FROM live) ORDER BY 1, 2"
                                     : "SELECT 0, id, name FROM subvolumes WHERE row_check IS NOT " SUBVOLUME_CHECK
                                       " UNION ALL SELECT 1, id, NULL FROM layers WHERE row_check IS NOT "
                                       LAYER_CHECK_OF("layers.")
                                       " UNION ALL SELECT 2, 0, key FROM meta WHERE row_check IS NOT "
                                       META_CHECK_OF("meta.")
                                       " UNION ALL SELECT 3, 0, key FROM counters WHERE row_check IS NOT "
                                       COUNTER_CHECK_OF("counters.")
                                       " UNION ALL SELECT 4, id, NULL FROM packs WHERE row_check IS NOT "
                                       PACK_CHECK_OF("packs.") " ORDER BY 1, 2, 3", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                const char *name = (const char *) sqlite3_column_text(st, 2);

                if (!GREEDY_REALLOC(d, allocated, n + 1)) {
                        r = -ENOMEM;
                        break;
                }
                d[n] = (CatalogDamage) {
                        .kind = (CatalogRecordKind) sqlite3_column_int(st, 0),
                        .id = (uint64_t) sqlite3_column_int64(st, 1),
                        .name = name ? strdup(name) : NULL,
                };
                if (name && !d[n].name) {
                        r = -ENOMEM;
                        break;
                }
                n++;
        }
        if (r >= 0 && ret_checked)
                r = sqlite_query_int(s->catalog, "SELECT (SELECT count(*) FROM subvolumes) + "
                                                 "(SELECT count(*) FROM layers) + (SELECT count(*) FROM meta) + "
                                                 "(SELECT count(*) FROM counters) + (SELECT count(*) FROM packs)",
                                     &checked);
        if (r < 0) {
                catalog_damage_array_free(d, n);
                return r;
        }
        if (ret_checked)
                *ret_checked = (uint64_t) checked;
        *ret = d;
        *ret_n = n;
        return 0;
}

/* An id handed out in a transaction that was rolled back is handed out
 * again (AUTOINCREMENT only skips those committed), and the files made for
 * it may still be there: no committed row ever named them, so they go. A
 * new layer must start empty, not with the contents of a failed attempt. */
int catalog_new_layer(Store *s, uint64_t parent, uint64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        uint64_t id;
        int r;

        r = sqlite_prepare(s->catalog, "INSERT INTO layers(parent, created_usec) VALUES (?1, ?2)", &st);
        if (r < 0)
                return r;
        if (parent)
                sqlite3_bind_int64(st, 1, (sqlite3_int64) parent);
        else
                sqlite3_bind_null(st, 1);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) now_usec());
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        id = (uint64_t) sqlite3_last_insert_rowid(s->catalog);
        r = layer_unlink(s, id);
        if (r < 0)
                return r;
        *ret = id;
        return 0;
}

int catalog_meta_get_int(Store *s, const char *key, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT value, row_check IS " META_CHECK_OF("meta.") " FROM meta WHERE key = ?1",
                           &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        if (r > 0 && !sqlite3_column_int(st, 1)) {
                store_log("the catalog's record of the setting '%s' is damaged: it is not used. 'cowbox-store "
                          "fsck --repair' mends it", key);
                return -EUCLEAN;
        }
        *ret = r > 0 ? sqlite3_column_int64(st, 0) : 0;
        return 0;
}

int catalog_check_identity(Store *s) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT key FROM meta WHERE key IN ('format', 'uuid', 'secret') AND "
                                       "row_check IS NOT " META_CHECK_OF("meta."), &st);
        if (r < 0)
                return r;
        r = sqlite_step_row(st);
        if (r <= 0)
                return r;
        store_log("the catalog's record of the store's %s is damaged: the store cannot be used",
                  (const char *) sqlite3_column_text(st, 0));
        return -EUCLEAN;
}

/* The store's identity is its own and cannot be made again. A setting
 * goes back to its default (a fold's record too: the layer it was making
 * is then a dead one, which the reaper drops). The transaction counter
 * goes on from the highest transaction a subvolume records, or its own
 * value if higher, never back; the count of corruption events keeps the
 * value it has. A pack's record is written anew, and one is made for each
 * pack that blocks name and no record does. */
int catalog_mend_record(Store *s, const CatalogDamage *d) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        switch (d->kind) {
        case CATALOG_RECORD_META:
                if (!d->name || streq(d->name, "format") || streq(d->name, "uuid") || streq(d->name, "secret"))
                        return -EUCLEAN;
                r = sqlite_prepare(s->catalog, "DELETE FROM meta WHERE key = ?1", &st);
                if (r < 0)
                        return r;
                sqlite3_bind_text(st, 1, d->name, -1, SQLITE_STATIC);
                return sqlite_step_done(st);
        case CATALOG_RECORD_COUNTER:
                if (!d->name)
                        return -EUCLEAN;
                r = sqlite_prepare(s->catalog,
                                   "INSERT OR REPLACE INTO counters(key, value) SELECT ?1, CASE ?1 "
                                   "  WHEN 'transid' THEN max(value, (SELECT coalesce(max(ctransid), 0) "
                                   "                                   FROM subvolumes)) "
                                   "  ELSE max(value, 0) END FROM counters WHERE key = ?1", &st);
                if (r < 0)
                        return r;
                sqlite3_bind_text(st, 1, d->name, -1, SQLITE_STATIC);
                return sqlite_step_done(st);
        case CATALOG_RECORD_PACK:
                r = sqlite_begin(s->catalog);
                if (r < 0)
                        return r;
                /* Written anew as they are: an id changed by the damage
                 * names no file, and the reaper drops it as an empty
                 * pack; the pack it named gets a record again from its
                 * blocks. */
                r = sqlite_exec(s->catalog, "INSERT OR REPLACE INTO packs(id, created_usec) SELECT id, created_usec "
                                            "FROM packs WHERE row_check IS NOT " PACK_CHECK_OF("packs.") ";"
                                            "INSERT INTO packs(id, created_usec) SELECT DISTINCT pack, 0 FROM blocks "
                                            "WHERE pack NOT IN (SELECT id FROM packs)");
                if (r >= 0)
                        r = sqlite_commit(s->catalog);
                if (r < 0)
                        sqlite_rollback(s->catalog);
                return r;
        default:
                return -EUCLEAN;        /* deleting the subvolume mends it */
        }
}

int catalog_meta_set_int(Store *s, const char *key, int64_t value) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, value);
        return sqlite_step_done(st);
}

/* The layer a fold is building, with the pid of the process building it.
 * Unreachable until the fold swaps it in, it is a dead layer to everyone
 * else meanwhile, and one that a crash of the fold leaves behind. */
#define META_FOLDING_LAYER "folding_layer"
#define META_FOLDING_PID "folding_pid"

int catalog_new_folding_layer(Store *s, uint64_t parent, uint64_t *ret) {
        uint64_t id;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;
        r = catalog_new_layer(s, parent, &id);
        if (r >= 0)
                r = catalog_meta_set_int(s, META_FOLDING_LAYER, (int64_t) id);
        if (r >= 0)
                r = catalog_meta_set_int(s, META_FOLDING_PID, (int64_t) getpid());
        if (r >= 0)
                r = sqlite_commit(s->catalog);
        if (r < 0) {
                sqlite_rollback(s->catalog);
                return r;
        }
        *ret = id;
        return 0;
}

int catalog_fold_done(Store *s) {
        return catalog_meta_set_int(s, META_FOLDING_LAYER, 0);
}

int catalog_folding_layer(Store *s, uint64_t *ret_id, pid_t *ret_pid) {
        int64_t id, pid;
        int r;

        CATALOG_LOCKED(s);
        r = catalog_meta_get_int(s, META_FOLDING_LAYER, &id);
        if (r >= 0)
                r = catalog_meta_get_int(s, META_FOLDING_PID, &pid);
        if (r < 0)
                return r;
        *ret_id = id > 0 ? (uint64_t) id : 0;
        *ret_pid = pid > 0 && pid <= INT32_MAX ? (pid_t) pid : 0;
        return 0;
}

static int set_top_layer(Store *s, uint64_t subvolume, uint64_t layer) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET top_layer = ?1 WHERE id = ?2", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) layer);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) subvolume);
        return sqlite_step_done(st);
}

/* Deleted subvolumes count until reaped: a UUID names one subvolume ever. */
static int check_uuid_free(Store *s, const char *uuid) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(s->catalog, "SELECT 1 FROM subvolumes WHERE uuid = ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, uuid, -1, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        return r > 0 ? -EEXIST : 0;
}

static int insert_snapshot_record(Store *s, const SubvolumeRecord *source, const char *name,
                                  bool readonly, uint64_t top, const char *uuid) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        uint64_t transid;
        int r;

        r = check_uuid_free(s, uuid);
        if (r < 0)
                return r;
        r = catalog_next_transid(s, &transid);
        if (r < 0)
                return r;
        r = sqlite_prepare(s->catalog,
                           "INSERT INTO subvolumes(name, uuid, parent_uuid, readonly, created_usec, top_layer, "
                           "quota_bytes, ctransid) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, uuid, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, source->uuid, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, readonly);
        sqlite3_bind_int64(st, 5, (sqlite3_int64) now_usec());
        sqlite3_bind_int64(st, 6, (sqlite3_int64) top);
        sqlite3_bind_int64(st, 7, (sqlite3_int64) source->quota_bytes); /* a snapshot keeps the limit */
        sqlite3_bind_int64(st, 8, (sqlite3_int64) transid);
        return sqlite_step_done(st);
}

/* In a transaction: -ESTALE unless the subvolume, not deleted, still has
 * the top layer the caller read (a fold may have merged it away since),
 * -ENOENT if it is gone. */
static int check_top_layer(Store *s, const SubvolumeRecord *rec) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(s->catalog, "SELECT top_layer FROM subvolumes WHERE id = ?1 AND deleted = 0", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) rec->id);
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        if (r == 0)
                return -ENOENT;
        return (uint64_t) sqlite3_column_int64(st, 0) == rec->top_layer ? 0 : -ESTALE;
}

/* In a transaction: the layer below a writable top that holds nothing,
 * its database never made; 0 if the top holds something, or is a bottom
 * layer. The caller keeps the top from being written meanwhile. */
static int layer_below_unwritten(Store *s, uint64_t top, uint64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = layer_exists(s, top);
        if (r != 0)
                return r < 0 ? r : 0;
        r = sqlite_prepare(s->catalog, "SELECT parent, row_check IS " LAYER_CHECK_OF("") " FROM layers "
                                       "WHERE id = ?1 AND made = 0", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) top);
        r = sqlite_step_row(st);
        if (r > 0 && !sqlite3_column_int(st, 1))
                return -EUCLEAN;        /* the parent a snapshot would stand on is not known */
        if (r <= 0 || sqlite3_column_type(st, 0) == SQLITE_NULL)
                return r < 0 ? r : 0;
        *ret = (uint64_t) sqlite3_column_int64(st, 0);
        return 1;
}

/* Freezes the source's top layer T: a writable source moves onto a new
 * empty layer above T; a writable snapshot gets its own new layer above T;
 * a read-only snapshot is T itself. Nothing is copied. A writable source
 * whose top is still empty keeps it, and the layer below stands for T:
 * else snapshots of a checkout between two changes of it would stack a
 * layer each, which every read of it then looks through. */
int catalog_snapshot(Store *s, const SubvolumeRecord *source, const char *name, bool readonly, const char *uuid) {
        uint64_t frozen = source->top_layer, snapshot_top, source_top;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;

        r = check_top_layer(s, source);
        if (r < 0)
                goto fail;
        if (!source->readonly) {
                r = layer_below_unwritten(s, source->top_layer, &frozen);
                if (r < 0)
                        goto fail;
        }
        if (!source->readonly && frozen == source->top_layer) {
                r = catalog_new_layer(s, frozen, &source_top);
                if (r < 0)
                        goto fail;
                r = set_top_layer(s, source->id, source_top);
                if (r < 0)
                        goto fail;
        }
        snapshot_top = frozen;
        if (!readonly) {
                r = catalog_new_layer(s, frozen, &snapshot_top);
                if (r < 0)
                        goto fail;
        }
        r = insert_snapshot_record(s, source, name, readonly, snapshot_top, uuid);
        if (r < 0)
                goto fail;
        return sqlite_commit(s->catalog);
fail:
        sqlite_rollback(s->catalog);
        return r;
}

/* A subvolume made read-only keeps its top layer, frozen (sealed by the
 * caller); one made writable gets a new empty layer above it, since the
 * frozen layer may be shared by snapshots. */
int catalog_set_readonly(Store *s, const SubvolumeRecord *rec, bool readonly) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        uint64_t top = rec->top_layer, transid;
        int r;

        if (rec->readonly == readonly)
                return 0;

        CATALOG_LOCKED(s);
        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;
        r = check_top_layer(s, rec);
        if (r < 0)
                goto fail;
        if (!readonly) {
                r = catalog_new_layer(s, rec->top_layer, &top);
                if (r < 0)
                        goto fail;
        }
        r = catalog_next_transid(s, &transid);
        if (r < 0)
                goto fail;
        /* Made writable, a received image is no longer what its sender
         * has: an increment sent against that would apply to another tree,
         * and a send of it would claim to be the original (btrfs clears
         * these too). */
        r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET readonly = ?1, top_layer = ?2, ctransid = ?3, "
                                       "received_uuid = CASE WHEN ?1 THEN received_uuid ELSE '' END, "
                                       "stransid = CASE WHEN ?1 THEN stransid ELSE 0 END "
                                       "WHERE id = ?4 AND deleted = 0", &st);
        if (r < 0)
                goto fail;
        sqlite3_bind_int(st, 1, readonly);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) top);
        sqlite3_bind_int64(st, 3, (sqlite3_int64) transid);
        sqlite3_bind_int64(st, 4, (sqlite3_int64) rec->id);
        r = sqlite_step_done(st);
        if (r < 0)
                goto fail;
        if (sqlite3_changes(s->catalog) == 0) {
                r = -ENOENT;
                goto fail;
        }
        return sqlite_commit(s->catalog);
fail:
        sqlite_rollback(s->catalog);
        return r;
}

static int lock_file_name(uint64_t id, char ret[static 32]) {
        snprintf(ret, 32, "subvolume-%" PRIu64 ".lock", id);
        return 0;
}

#define LOCK_EXITING_WAIT_USEC 2000000
#define LOCK_RETRY_USEC 10000
#define LOCK_BRIEF_WAIT_USEC 60000000
#define LOCK_NAMED_GRACE_USEC 100000

/* Whether the lock file says its holder keeps it for a moment only. */
static bool lock_is_brief(Store *s, const char *name) {
        _cleanup_close_ int fd = openat(s->locks_fd, name, O_RDONLY | O_CLOEXEC);
        char buf[32] = {};

        return fd >= 0 && read(fd, buf, sizeof buf - 1) > 0 && strstr(buf, " brief");
}

int subvolume_lock(Store *s, uint64_t id, bool exclusive, pid_t *ret_holder) {
        return subvolume_lock_full(s, id, exclusive, 0, ret_holder);
}

int subvolume_lock_full(Store *s, uint64_t id, bool exclusive, SubvolumeLockFlags flags, pid_t *ret_holder) {
        _cleanup_close_ int fd = -EBADF;
        char name[32];
        int r;

        lock_file_name(id, name);
        fd = openat(s->locks_fd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        for (unsigned waited = 0;; waited += LOCK_RETRY_USEC) {
                pid_t holder = 0;

                if (flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) >= 0) {
                        struct stat st;

                        /* Removed under us: the reaper has forgotten the
                         * subvolume since we looked it up. */
                        if (fstat(fd, &st) < 0)
                                return -errno;
                        if (st.st_nlink == 0)
                                return -ENOENT;
                        break;
                }
                if (errno != EWOULDBLOCK)
                        return -errno;
                if (read_pid_file(s->locks_fd, name, &holder) < 0)
                        holder = 0;
                /* The holder was killed and is on its way out: a remount
                 * straight after a crash waits for it rather than fail. A
                 * holder that needs it for a moment (a fold, a snapshot) is
                 * waited for too. So is one that took the lock and has not
                 * written its pid yet: the file names nobody alive, or for
                 * an instant still the previous holder, who may live on; a
                 * holder that lives is believed after a short grace. A
                 * patient caller waits as long for a holder that lives. */
                if (lock_is_brief(s, name) && waited < LOCK_BRIEF_WAIT_USEC) {
                        (void) usleep(LOCK_RETRY_USEC);
                        continue;
                }
                if ((holder > 0 && !process_is_exiting(holder) && !(flags & SUBVOLUME_LOCK_PATIENT) &&
                     waited >= LOCK_NAMED_GRACE_USEC) ||
                    waited >= LOCK_EXITING_WAIT_USEC) {
                        if (ret_holder)
                                *ret_holder = holder;
                        return -EBUSY;
                }
                (void) usleep(LOCK_RETRY_USEC);
        }

        /* The holder's pid is for messages only; the lock itself is the flock. */
        if (!(flags & SUBVOLUME_LOCK_UNNAMED)) {
                r = write_pid_file(fd, flags & SUBVOLUME_LOCK_BRIEF ? " brief" : "");
                if (r < 0)
                        return r;
        }
        return TAKE_FD(fd);
}

/* Another process that holds the lock of fd shared (a read-only server),
 * as the kernel lists flock() locks: found without taking the lock, which
 * would make one that starts meanwhile fail. Matched by inode (a file
 * system's device number in the list may not be the one stat() gives). */
static pid_t shared_lock_holder(int fd) {
        _cleanup_fclose_ FILE *f = NULL;
        _cleanup_free_ char *line = NULL;
        size_t size = 0;
        struct stat st;

        if (fstat(fd, &st) < 0)
                return 0;
        f = fopen("/proc/locks", "re");
        if (!f)
                return 0;
        while (getline(&line, &size, f) > 0) {
                unsigned long long ino;
                char mode[8];
                int pid;

                /* "1: FLOCK  ADVISORY  READ  1234 fe:01:5678 0 EOF"; waiters have "->". */
                if (sscanf(line, "%*d: FLOCK %*s %7s %d %*x:%*x:%llu", mode, &pid, &ino) == 3 &&
                    streq(mode, "READ") && ino == (unsigned long long) st.st_ino && pid > 0 && pid != getpid())
                        return pid;
        }
        return 0;
}

int subvolume_lock_holder(Store *s, uint64_t id, pid_t *ret_holder) {
        _cleanup_close_ int fd = -EBADF;
        char name[32];

        *ret_holder = 0;
        lock_file_name(id, name);
        fd = openat(s->locks_fd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        /* Shared: an exclusive probe could make a read-only server that
         * starts meanwhile fail. Those are looked for in the kernel's list. */
        if (flock(fd, LOCK_SH | LOCK_NB) < 0) {
                if (errno != EWOULDBLOCK)
                        return -errno;
                if (read_pid_file(s->locks_fd, name, ret_holder) < 0)
                        *ret_holder = 0;
                return 1;
        }
        (void) flock(fd, LOCK_UN);
        *ret_holder = shared_lock_holder(fd);
        return *ret_holder > 0;
}

/* Whether a row of table (layers, subvolumes) has this id: 1, 0, or a
 * negative errno. */
int catalog_id_known(Store *s, const char *table, uint64_t id) {
        int64_t found = 0;
        char sql[96];
        int r;

        snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE id = %" PRIu64, table, id);
        CATALOG_LOCKED(s);
        r = sqlite_query_int(s->catalog, sql, &found);
        return r < 0 ? r : found > 0;
}

/* Removes the lock files of subvolumes the catalog has forgotten, which
 * would otherwise pile up, one for every subvolume ever made. Ids are
 * never handed out again (AUTOINCREMENT), so no live subvolume uses such a
 * file. One still locked (by a process that looked the subvolume up before
 * it was deleted) is left for the next reap, and subvolume_lock_full()
 * refuses a file removed under it. Ids above the last one handed out may be
 * of a subvolume being made: left alone. */
int subvolume_locks_prune(Store *s) {
        _cleanup_closedir_ DIR *d = NULL;
        int64_t last_id = 0;
        struct dirent *de;
        int r;

        {
                CATALOG_LOCKED(s);
                r = sqlite_query_int(s->catalog, "SELECT seq FROM sqlite_sequence WHERE name = 'subvolumes'",
                                     &last_id);
        }
        if (r < 0)
                return r;
        d = opendir_dup(s->locks_fd);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                _cleanup_close_ int fd = -EBADF;
                char name[32];
                uint64_t id;

                /* Only names we make: the round trip refuses any other
                 * spelling of the number, and any tail. */
                if (sscanf(de->d_name, "subvolume-%" SCNu64, &id) != 1)
                        continue;
                lock_file_name(id, name);
                if (!streq(name, de->d_name) || id > (uint64_t) last_id)
                        continue;       /* or a subvolume being made */
                r = catalog_id_known(s, "subvolumes", id);
                if (r < 0)
                        break;
                if (r > 0)
                        continue;
                fd = openat(dirfd(d), de->d_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0)
                        continue;
                (void) unlinkat(dirfd(d), de->d_name, 0);
        }
        return MIN(r, 0);
}

int catalog_dead_layers(Store *s, uint64_t **ret_ids, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, LIVE_LAYERS_CTE "SELECT id FROM layers WHERE id NOT IN live", &st);
        if (r < 0)
                return r;
        return sqlite_collect_ids(st, ret_ids, ret_n);
}

int catalog_live_layers(Store *s, uint64_t **ret_ids, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, LIVE_LAYERS_CTE "SELECT layer FROM live", &st);
        if (r < 0)
                return r;
        return sqlite_collect_ids(st, ret_ids, ret_n);
}

int catalog_all_layer_users(Store *s, LayerUsers **ret, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_free_ LayerUsers *rows = NULL;
        size_t n = 0, allocated = 0;
        int r;

        CATALOG_LOCKED(s);
        /* Each live subvolume with each layer of its stack. */
        r = sqlite_prepare(s->catalog,
                           "WITH RECURSIVE chain(sub, layer) AS ("
                           "  SELECT id, top_layer FROM subvolumes WHERE deleted = 0"
                           "  UNION SELECT chain.sub, layers.parent FROM chain JOIN layers ON layers.id = chain.layer"
                           "  WHERE layers.parent IS NOT NULL) "
                           "SELECT layer, count(DISTINCT sub) FROM chain GROUP BY layer ORDER BY layer", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(rows, allocated, n + 1))
                        return -ENOMEM;
                rows[n++] = (LayerUsers) {
                        .layer = (uint64_t) sqlite3_column_int64(st, 0),
                        .users = sqlite3_column_int64(st, 1),
                };
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(rows);
        *ret_n = n;
        return 0;
}

int catalog_layer_is_shared(Store *s, uint64_t layer) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        /* The layers built on it, down to the live tops among them: a
         * second one is enough. */
        r = sqlite_prepare(s->catalog,
                           "WITH RECURSIVE above(layer) AS ("
                           "  SELECT ?1"
                           "  UNION ALL SELECT layers.id FROM layers JOIN above ON layers.parent = above.layer) "
                           "SELECT count(*) FROM (SELECT 1 FROM above JOIN subvolumes"
                           "  ON subvolumes.top_layer = above.layer AND subvolumes.deleted = 0 LIMIT 2)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) layer);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -EIO;
        return sqlite3_column_int64(st, 0) > 1;
}

int catalog_block_totals(Store *s, uint64_t *ret_blocks, uint64_t *ret_bytes) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT count(*), total(stored_len) FROM blocks", &st);
        if (r < 0)
                return r;
        r = sqlite_step_row(st);
        if (r < 0)
                return r;
        *ret_blocks = (uint64_t) sqlite3_column_int64(st, 0);
        *ret_bytes = (uint64_t) sqlite3_column_double(st, 1);
        return 0;
}

int catalog_metadata_bytes(Store *s, uint64_t *ret_bytes, uint64_t *ret_layers) {
        _cleanup_free_ uint64_t *ids = NULL;
        struct stat st;
        size_t n = 0;
        uint64_t total = 0;
        int r;

        r = catalog_live_layers(s, &ids, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                total += layer_file_bytes(s, ids[i]);
        FOREACH_STRING(f, "catalog.db", "catalog.db-wal")
                if (fstatat(s->dir_fd, f, &st, 0) >= 0)
                        total += (uint64_t) st.st_blocks * 512;
        *ret_bytes = total;
        *ret_layers = n;
        return 0;
}

int catalog_pack_has_blocks(Store *s, uint64_t pack) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT 1 FROM blocks WHERE pack = ?1 LIMIT 1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) pack);
        return sqlite_step_row(st);
}

int catalog_list_blocks(Store *s, uint64_t pack, BlockRow **ret, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_free_ BlockRow *rows = NULL;
        size_t n = 0, allocated = 0;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog,
                           "SELECT digest, pack, offset, stored_len, raw_len FROM blocks "
                           "WHERE ?1 = 0 OR pack = ?1 ORDER BY pack, offset", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) pack);
        while ((r = sqlite_step_row(st)) > 0) {
                size_t len = (size_t) sqlite3_column_bytes(st, 0);

                if (!GREEDY_REALLOC(rows, allocated, n + 1))
                        return -ENOMEM;
                /* A digest of the wrong length (a damaged index) stays zero: it
                 * matches no block, so scrub reports the row, and the row still
                 * keeps its record from the reaper's reclaim. */
                rows[n].digest = (Digest) {};
                memcpy(rows[n].digest.bytes, sqlite3_column_blob(st, 0) ?: "",
                       len == sizeof(Digest) ? len : 0);
                rows[n].loc = (BlockLocation) {
                        .pack = (uint64_t) sqlite3_column_int64(st, 1),
                        .offset = (uint64_t) sqlite3_column_int64(st, 2),
                        .stored_len = (uint32_t) sqlite3_column_int(st, 3),
                        .raw_len = (uint32_t) sqlite3_column_int(st, 4),
                };
                n++;
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(rows);
        *ret_n = n;
        return 0;
}
