/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* scrub: read and verify every block, name the files that use a damaged
 * one. fsck: check the catalog, the layers and the block index against
 * each other. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "time-util.h"

/* A terminal's progress line moves; a D-Bus client is not flooded. */
#define SCRUB_PROGRESS_USEC (200 * 1000)

#define PATH_DEPTH_MAX 4096

/* Frozen layers opened once for all the stacks that share them (fsck walks
 * every subvolume, and the snapshots of one share most of its stack); up
 * to a bound, each a file descriptor. */
#define LAYER_POOL_MAX 512

typedef struct LayerPool {
        uint64_t ids[LAYER_POOL_MAX];
        sqlite3 *dbs[LAYER_POOL_MAX];   /* NULL: the layer has no database, or it is lost */
        int results[LAYER_POOL_MAX];    /* of opening it: 0, -ENOENT (none) or -EUCLEAN (lost) */
        size_t n;
} LayerPool;

static void layer_pool_done(LayerPool *pool) {
        for (size_t i = 0; i < pool->n; i++)
                if (pool->dbs[i])
                        sqlite3_close_v2(pool->dbs[i]);
        pool->n = 0;
}

/* The layers of a subvolume's stack, opened for reading; the lookups that
 * reports need are prepared on their first use. */
typedef struct Stack {
        char *subvolume;
        uint64_t *ids;
        sqlite3 **dbs;          /* NULL entries: layers without a database */
        bool *pooled;           /* dbs the pool owns */
        sqlite3_stmt **get_dentry;
        sqlite3_stmt **get_inode;
        size_t n;
        uint64_t lost_layer;    /* the first layer whose database is lost or unreadable, 0 if none */
} Stack;

static void stack_done(Stack *st) {
        for (size_t i = 0; i < st->n; i++) {
                if (st->get_dentry)
                        sqlite3_finalize(st->get_dentry[i]);
                if (st->get_inode)
                        sqlite3_finalize(st->get_inode[i]);
                if (st->dbs && st->dbs[i] && !(st->pooled && st->pooled[i]))
                        sqlite3_close_v2(st->dbs[i]);
        }
        free(st->get_dentry);
        free(st->get_inode);
        free(st->pooled);
        free(st->dbs);
        free(st->ids);
        free(st->subvolume);
        *st = (Stack) {};
}

/* A frozen layer from the pool, opened there if it has room: 1 if pooled,
 * with the result of opening it (*ret NULL where it has no database, or
 * it is lost), 0 if the caller is to open it. */
static int layer_pool_get(Store *s, LayerPool *pool, uint64_t id, sqlite3 **ret, int *ret_result) {
        int r;

        if (!pool)
                return 0;
        for (size_t i = 0; i < pool->n; i++)
                if (pool->ids[i] == id) {
                        *ret = pool->dbs[i];
                        *ret_result = pool->results[i];
                        return 1;
                }
        if (pool->n == LAYER_POOL_MAX)
                return 0;
        pool->dbs[pool->n] = NULL;
        r = layer_open(s, id, LAYER_READ_FROZEN, &pool->dbs[pool->n]);
        if (r < 0 && r != -ENOENT && r != -EUCLEAN)
                return r;
        pool->ids[pool->n] = id;
        pool->results[pool->n] = r;
        *ret = pool->dbs[pool->n++];
        *ret_result = r;
        return 1;
}

static int stack_open(Store *s, const SubvolumeRecord *rec, LayerPool *pool, Stack *ret) {
        int r;

        *ret = (Stack) {};
        ret->subvolume = strdup(rec->name);
        if (!ret->subvolume)
                return -ENOMEM;
        r = catalog_layer_stack(s, rec->top_layer, &ret->ids, &ret->n);
        if (r < 0)
                return r;
        ret->dbs = calloc(ret->n, sizeof *ret->dbs);
        ret->pooled = calloc(ret->n, sizeof *ret->pooled);
        ret->get_dentry = calloc(ret->n, sizeof *ret->get_dentry);
        ret->get_inode = calloc(ret->n, sizeof *ret->get_inode);
        if (!ret->dbs || !ret->pooled || !ret->get_dentry || !ret->get_inode)
                return -ENOMEM;
        for (size_t i = 0; i < ret->n; i++) {
                /* Frozen layers never change: read without locks. */
                bool frozen = i > 0 || rec->readonly;
                int pooled = frozen ? layer_pool_get(s, pool, ret->ids[i], &ret->dbs[i], &r) : 0;

                if (pooled < 0)
                        return pooled;
                ret->pooled[i] = pooled > 0;
                if (!pooled)
                        r = layer_open(s, ret->ids[i], frozen ? LAYER_READ_FROZEN : LAYER_READ, &ret->dbs[i]);
                /* Lost: read as if empty, for reports to name what they
                 * can; checks of the tree know it is not. */
                if (r == -EUCLEAN && ret->lost_layer == 0)
                        ret->lost_layer = ret->ids[i];
                if (r < 0 && r != -ENOENT && r != -EUCLEAN)
                        return r;
        }
        return 0;
}

/* A lookup of layer i, prepared on its first use; NULL without a database,
 * or if it cannot be prepared (taken as no row). */
static sqlite3_stmt *stack_lookup(const Stack *st, sqlite3_stmt **stmts, size_t i, const char *sql) {
        if (!stmts[i] && st->dbs[i])
                (void) sqlite_prepare(st->dbs[i], sql, &stmts[i]);
        return stmts[i];
}

/* A walk with a query an entry reads each layer in one transaction: in
 * autocommit, every query locks the database file, looks at it again and
 * unlocks it, system calls that cost more than the query. */
static void stack_read_end(const Stack *st) {
        for (size_t i = 0; i < st->n; i++)
                if (st->dbs[i] && !sqlite3_get_autocommit(st->dbs[i]))
                        (void) sqlite_exec(st->dbs[i], "COMMIT");
}

/* The database of the highest layer that has one: where the counters live. */
static sqlite3 *stack_top_db(const Stack *st) {
        for (size_t i = 0; i < st->n; i++)
                if (st->dbs[i])
                        return st->dbs[i];
        return NULL;
}

static int stack_read_begin(const Stack *st) {
        for (size_t i = 0; i < st->n; i++) {
                int r;

                if (!st->dbs[i])
                        continue;
                r = sqlite_begin_deferred(st->dbs[i]);
                if (r < 0) {
                        stack_read_end(st);
                        return r;
                }
        }
        return 0;
}

/* The ids of the stack's layers that have a database, top first: two
 * stacks with the same ones hold the same tree. */
typedef struct StackLayers {
        uint64_t *ids;
        size_t n;
} StackLayers;

static int stack_layers(const Stack *st, StackLayers *ret) {
        *ret = (StackLayers) { .ids = calloc(MAX(st->n, 1u), sizeof *ret->ids) };
        if (!ret->ids)
                return -ENOMEM;
        for (size_t i = 0; i < st->n; i++)
                if (st->dbs[i])
                        ret->ids[ret->n++] = st->ids[i];
        return 0;
}

static bool stack_layers_equal(const StackLayers *a, const StackLayers *b) {
        return a->n == b->n && memcmp(a->ids, b->ids, a->n * sizeof *a->ids) == 0;
}

/* Steps a prepared lookup once: 1 and its first column in *ret if it has a
 * row, 0 if not. */
static int lookup_step(sqlite3_stmt *q, uint64_t *ret) {
        int r = sqlite_step_row(q);

        if (r > 0 && ret)
                *ret = (uint64_t) sqlite3_column_int64(q, 0);
        sqlite3_reset(q);
        return r;
}

/* The inode that (parent, name) names in the stack, 0 if none. */
static int stack_dentry(const Stack *st, uint64_t parent, const void *name, int name_len, uint64_t *ret) {
        *ret = 0;
        for (size_t i = 0; i < st->n; i++) {
                sqlite3_stmt *q = stack_lookup(st, st->get_dentry, i,
                                               "SELECT ino FROM dentries WHERE parent = ?1 AND name = ?2");
                int r;

                if (!q)
                        continue;
                sqlite3_bind_int64(q, 1, (sqlite3_int64) parent);
                sqlite3_bind_blob(q, 2, name, name_len, SQLITE_TRANSIENT);
                r = lookup_step(q, ret);
                if (r != 0)
                        return r < 0 ? r : 0;
        }
        return 0;
}

/* One visible name of ino: walks up through visible entries to the root. */
static int stack_path(const Stack *st, uint64_t ino, char **ret) {
        _cleanup_free_ char *path = strdup("");

        if (!path)
                return -ENOMEM;
        for (unsigned depth = 0; ino != 1; depth++) {
                bool found = false;

                if (depth > PATH_DEPTH_MAX)
                        return -ELOOP;
                for (size_t i = 0; i < st->n && !found; i++) {
                        _cleanup_stmt_ sqlite3_stmt *q = NULL;
                        int r;

                        if (!st->dbs[i])
                                continue;
                        r = sqlite_prepare(st->dbs[i], "SELECT parent, name FROM dentries WHERE ino = ?1", &q);
                        if (r < 0)
                                return r;
                        sqlite3_bind_int64(q, 1, (sqlite3_int64) ino);
                        while (!found && (r = sqlite_step_row(q)) > 0) {
                                uint64_t parent = (uint64_t) sqlite3_column_int64(q, 0), visible;
                                const void *name = sqlite3_column_blob(q, 1);
                                int len = sqlite3_column_bytes(q, 1);
                                char *p;

                                r = stack_dentry(st, parent, name, len, &visible);
                                if (r < 0)
                                        return r;
                                if (visible != ino)
                                        continue;
                                if (asprintf(&p, "/%.*s%s", len, (const char *) name, path) < 0)
                                        return -ENOMEM;
                                free(path);
                                path = p;
                                ino = parent;
                                found = true;
                        }
                        if (r < 0)
                                return r;
                }
                if (!found)
                        return -ENOENT; /* not reachable: unlinked, or hidden */
        }
        *ret = path[0] ? TAKE_PTR(path) : strdup("/");
        return *ret ? 0 : -ENOMEM;
}

/* Calls fn for the stack of every live subvolume. */
typedef int (*stack_fn)(Store *s, const Stack *st, void *userdata);

/* Whether a stack that cannot be read stands on a damaged record of a
 * layer, which scrub reports by itself: damage elsewhere in the catalog
 * explains no broken stack. */
static bool stack_damage_known(Store *s, const SubvolumeRecord *rec) {
        uint64_t layer;

        return catalog_stack_damaged_layer(s, rec->top_layer, &layer) > 0;
}

static int for_each_stack(Store *s, stack_fn fn, void *userdata) {
        _cleanup_free_ SubvolumeRecord *recs = NULL;
        size_t n = 0;
        int r;

        r = catalog_list_subvolumes(s, true, &recs, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                if (r >= 0) {
                        _cleanup_(stack_done) Stack st = {};

                        r = stack_open(s, &recs[i], NULL, &st);
                        /* A stack over a damaged record of the catalog,
                         * which scrub reported already. */
                        if (r == -EUCLEAN && stack_damage_known(s, &recs[i]))
                                r = 0;
                        else if (r >= 0)
                                r = fn(s, &st, userdata);
                }
                subvolume_record_clear(&recs[i]);
        }
        return r;
}

/* What a damaged block or row is reported with. */
typedef struct DamageReport {
        StoreDamage *damage;
        store_damage_cb cb;
        void *userdata;
        StoreScrubStats *stats;
        const Digest *digest;
        bool reported;
} DamageReport;

static void report_damage(DamageReport *rep, const Stack *st, uint64_t ino) {
        _cleanup_free_ char *path = NULL;

        if (stack_path(st, ino, &path) < 0)
                return; /* not reachable in this subvolume */
        rep->damage->subvolume = st->subvolume;
        rep->damage->path = path;
        if (rep->cb)
                rep->cb(rep->damage, rep->userdata);
        rep->damage->path = NULL;
        rep->stats->files_damaged++;
        rep->reported = true;
}

static int stack_extent_hidden(const Stack *st, size_t layer, uint64_t ino, uint64_t idx);

/* The files of a stack whose data uses the block: an extent of a layer
 * that no layer above overrides (rewritten, or cut off by a truncation),
 * each file once. */
static int report_block_users(Store *s, const Stack *st, void *userdata) {
        DamageReport *rep = userdata;
        int r = 0;

        for (size_t l = 0; r >= 0 && l < st->n; l++) {
                _cleanup_stmt_ sqlite3_stmt *q = NULL;
                uint64_t last = 0;

                if (!st->dbs[l])
                        continue;
                r = sqlite_prepare(st->dbs[l], "SELECT ino, idx FROM extents WHERE digest = ?1 ORDER BY ino", &q);
                if (r < 0)
                        break;
                sqlite3_bind_blob(q, 1, rep->digest->bytes, sizeof rep->digest->bytes, SQLITE_STATIC);
                while ((r = sqlite_step_row(q)) > 0) {
                        uint64_t ino = (uint64_t) sqlite3_column_int64(q, 0);
                        int hidden;

                        if (ino == last)
                                continue;
                        hidden = stack_extent_hidden(st, l, ino, (uint64_t) sqlite3_column_int64(q, 1));
                        if (hidden < 0)
                                return hidden;
                        if (hidden > 0)
                                continue;
                        report_damage(rep, st, ino);
                        last = ino;
                }
        }
        return r;
}

/* Calls back once per (subvolume, path) that uses the block, or once with
 * neither if no file uses it. */
static int report_users(Store *s, const Digest *d, StoreDamage *damage, store_damage_cb cb, void *userdata,
                        StoreScrubStats *stats) {
        DamageReport rep = { .damage = damage, .cb = cb, .userdata = userdata, .stats = stats, .digest = d };
        int r;

        r = for_each_stack(s, report_block_users, &rep);
        if (r < 0)
                return r;
        if (!rep.reported) {
                damage->subvolume = NULL;
                damage->path = NULL;
                cb(damage, userdata);
        }
        return 0;
}

/* Whether a layer above the given one has a row that the query counts. */
static int stack_upper_count(const Stack *st, size_t layer, const char *sql) {
        for (size_t i = 0; i < layer; i++) {
                int64_t found = 0;
                int r;

                if (!st->dbs[i])
                        continue;
                r = sqlite_query_int(st->dbs[i], sql, &found);
                if (r < 0)
                        return r;
                if (found > 0)
                        return 1;
        }
        return 0;
}

/* Whether a layer above the given one has a row for ino (which hides it). */
static int stack_row_hidden(const Stack *st, size_t layer, uint64_t ino) {
        for (size_t i = 0; i < layer; i++) {
                sqlite3_stmt *q = stack_lookup(st, st->get_inode, i, "SELECT 1 FROM inodes WHERE ino = ?1");
                int r;

                if (!q)
                        continue;
                sqlite3_bind_int64(q, 1, (sqlite3_int64) ino);
                r = lookup_step(q, NULL);
                if (r != 0)
                        return r;
        }
        return 0;
}

/* Whether an inline content reads: its checksum, and its decompression
 * (which needs the dictionary it names, if any). */
static const char *inline_damage(Store *s, ZSTD_DCtx *dctx, sqlite3_stmt *q, void *buf) {
        const void *data = sqlite3_column_blob(q, 1);
        size_t len = (size_t) sqlite3_column_bytes(q, 1), n;

        if (inline_check(data, len) != (uint64_t) sqlite3_column_int64(q, 2))
                return "inline content checksum mismatch";
        if (sqlite3_column_int(q, 3) && zstd_decompress(s, dctx, buf, INLINE_MAX, data, len, &n) < 0)
                return "inline content cannot be decompressed (damaged, or its dictionary is)";
        return NULL;
}

/* Whether a layer above the given one decides what block idx of ino is: an
 * extent of its own, or an inode row that cuts the layers below off. */
static int stack_extent_hidden(const Stack *st, size_t layer, uint64_t ino, uint64_t idx) {
        char sql[256];

        snprintf(sql, sizeof sql,
                 "SELECT (SELECT count(*) FROM extents WHERE ino = %1$" PRIu64 " AND idx = %2$" PRIu64 ") + "
                 "(SELECT count(*) FROM inodes WHERE ino = %1$" PRIu64 " AND (data IS NOT NULL OR "
                 "lower_limit <= %2$" PRIu64 " * " STRINGIFY(STORE_BLOCK_SIZE) "))",
                 ino, idx);
        return stack_upper_count(st, layer, sql);
}

/* Rows whose check fails, table by table: the file each one is part of, and
 * how to tell whether a layer above hides it (NULL: it counts wherever it
 * is; a damaged directory entry fails its directory's listing). */
typedef enum RowHiding {
        ROW_HIDDEN_BY_INODE,
        ROW_HIDDEN_BY_EXTENT,
        ROW_NEVER_HIDDEN,
} RowHiding;

static const struct {
        const char *sql;        /* columns: the inode to name, the block index */
        const char *reason;
        RowHiding hiding;
} damaged_row_queries[] = {
        { "SELECT ino, 0 FROM inodes WHERE row_check IS NOT " INODE_CHECK,
          "inode record checksum mismatch", ROW_HIDDEN_BY_INODE },
        { "SELECT DISTINCT parent, 0 FROM dentries WHERE row_check IS NOT " DENTRY_CHECK,
          "directory entry checksum mismatch", ROW_NEVER_HIDDEN },
        { "SELECT DISTINCT ino, 0 FROM xattrs WHERE row_check IS NOT " XATTR_CHECK,
          "extended attribute checksum mismatch", ROW_HIDDEN_BY_INODE },
        { "SELECT ino, idx FROM extents WHERE row_check IS NOT " EXTENT_CHECK,
          "extent record checksum mismatch", ROW_HIDDEN_BY_EXTENT },
        { "SELECT 0, 0 FROM blockrefs WHERE row_check IS NOT " BLOCKREF_CHECK " LIMIT 1",
          "block reference count checksum mismatch", ROW_NEVER_HIDDEN },
        { "SELECT 0, 0 FROM info WHERE row_check IS NOT " INFO_CHECK " LIMIT 1",
          "layer counters checksum mismatch", ROW_NEVER_HIDDEN },
};

static void report_layer_damage(DamageReport *rep, const Stack *st) {
        rep->damage->subvolume = st->subvolume;
        rep->damage->path = NULL;
        if (rep->cb)
                rep->cb(rep->damage, rep->userdata);
        rep->reported = true;
}

/* A damaged record of a layer: found once, however many subvolumes share
 * the layer, then reported for each subvolume that uses it. */
typedef struct DamagedRow {
        uint64_t layer;
        uint64_t ino;           /* 0: the layer as a whole */
        uint64_t idx;
        const char *reason;
        RowHiding hiding;
        bool is_inline;         /* a small file's content: counted as a block */
        bool counted;           /* in use by some subvolume, and counted */
} DamagedRow;

typedef struct DamageList {
        DamagedRow *rows;
        size_t n, allocated;
} DamageList;

static int damage_add(DamageList *list, DamagedRow row) {
        if (!GREEDY_REALLOC(list->rows, list->allocated, list->n + 1))
                return -ENOMEM;
        list->rows[list->n++] = row;
        return 0;
}

/* Small files' contents and symlink targets live in the layers' databases,
 * each with its own checksum, and every row of a layer has a check of its
 * own: all verified once per layer. */
/* A layer whose database is lost, or cannot be read at all: damage to
 * every subvolume that uses it. */
static int layer_lost_add(Store *s, uint64_t id, DamageList *list, StoreScrubStats *stats) {
        stats->rows_checked++;
        return damage_add(list, (DamagedRow) {
                .layer = id,
                .reason = layer_exists(s, id) > 0 ? "layer database unreadable" : "layer database missing",
                .hiding = ROW_NEVER_HIDDEN,
        });
}

static int scrub_layer(Store *s, uint64_t id, ZSTD_DCtx *dctx, void *buf, StoreScrubStats *stats,
                       DamageList *list) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_stmt_ sqlite3_stmt *q = NULL;
        int64_t n = 0;
        int r;

        r = layer_open(s, id, LAYER_READ, &db);
        if (r == -ENOENT)
                return 0; /* no database: an empty layer */
        if (r == -EUCLEAN)
                return layer_lost_add(s, id, list, stats);
        if (r < 0)
                return r;

        r = sqlite_prepare(db, "SELECT ino, data, data_check, data_zstd FROM inodes WHERE data IS NOT NULL", &q);
        if (r == -EUCLEAN)
                return layer_lost_add(s, id, list, stats);
        while (r >= 0 && (r = sqlite_step_row(q)) > 0) {
                const char *reason;

                stats->blocks_checked++;
                stats->bytes_checked += (uint64_t) sqlite3_column_bytes(q, 1);
                reason = inline_damage(s, dctx, q, buf);
                if (reason)
                        r = damage_add(list, (DamagedRow) { .layer = id, .ino = (uint64_t) sqlite3_column_int64(q, 0),
                                                            .reason = reason, .hiding = ROW_HIDDEN_BY_INODE,
                                                            .is_inline = true });
        }
        if (r < 0 || !layer_has_row_checks(db, "main"))
                return r;

        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(damaged_row_queries); i++) {
                _cleanup_stmt_ sqlite3_stmt *rows = NULL;

                r = sqlite_prepare(db, damaged_row_queries[i].sql, &rows);
                while (r >= 0 && (r = sqlite_step_row(rows)) > 0)
                        r = damage_add(list, (DamagedRow) { .layer = id,
                                                            .ino = (uint64_t) sqlite3_column_int64(rows, 0),
                                                            .idx = (uint64_t) sqlite3_column_int64(rows, 1),
                                                            .reason = damaged_row_queries[i].reason,
                                                            .hiding = damaged_row_queries[i].hiding });
        }
        if (r < 0)
                return r;
        r = sqlite_query_int(db,
                             "SELECT (SELECT count(*) FROM inodes) + (SELECT count(*) FROM dentries) + "
                             "(SELECT count(*) FROM xattrs) + (SELECT count(*) FROM extents) + "
                             "(SELECT count(*) FROM blockrefs) + (SELECT count(*) FROM info)", &n);
        stats->rows_checked += (uint64_t) n;
        return r;
}

typedef struct DamagedRowsReport {
        DamageList *list;
        DamageReport rep;
} DamagedRowsReport;

/* The damaged records that the stack uses: a record that a layer above
 * replaces is not read, and not reported for this subvolume. */
static int report_damaged_rows(Store *s, const Stack *st, void *userdata) {
        DamagedRowsReport *drr = userdata;
        DamageList *list = drr->list;
        int r;

        for (size_t i = 0; i < list->n; i++) {
                DamagedRow *row = &list->rows[i];
                StoreDamage damage = { .reason = row->reason };
                size_t l = 0;

                while (l < st->n && st->ids[l] != row->layer)
                        l++;
                if (l == st->n)
                        continue;
                switch (row->hiding) {
                case ROW_HIDDEN_BY_INODE:
                        r = stack_row_hidden(st, l, row->ino);
                        break;
                case ROW_HIDDEN_BY_EXTENT:
                        r = stack_extent_hidden(st, l, row->ino, row->idx);
                        break;
                default:
                        r = 0;
                        break;
                }
                if (r < 0)
                        return r;
                if (r > 0)
                        continue;

                if (!row->counted) {
                        row->counted = true;
                        block_count_corruption(s);
                        if (row->is_inline)
                                drr->rep.stats->blocks_damaged++;
                        else
                                drr->rep.stats->rows_damaged++;
                }
                if (row->is_inline)
                        snprintf(damage.digest, sizeof damage.digest, "layer %" PRIu64 " inode %" PRIu64,
                                 row->layer, row->ino);
                else
                        snprintf(damage.digest, sizeof damage.digest, "layer %" PRIu64, row->layer);
                drr->rep.damage = &damage;
                if (row->ino == 0)
                        report_layer_damage(&drr->rep, st);
                else
                        report_damage(&drr->rep, st, row->ino);
        }
        return 0;
}

/* Blocks a layer references that the block index lacks: their data is
 * lost, for each file that uses them. A block that several layers lack is
 * named once for each (each names its users in every subvolume, the same
 * ones). */
static int report_unindexed_blocks(Store *s, uint64_t id, store_damage_cb cb, void *userdata,
                                   StoreScrubStats *stats) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_stmt_ sqlite3_stmt *q = NULL;
        int r;

        r = layer_open(s, id, LAYER_READ, &db);
        if (r == -ENOENT || r == -EUCLEAN)
                return 0;       /* none, or lost: named already */
        if (r < 0)
                return r;
        r = sqlite_prepare(db, "SELECT digest FROM blockrefs", &q);
        while (r >= 0 && (r = sqlite_step_row(q)) > 0) {
                StoreDamage damage = { .reason = "block missing from the index" };
                BlockLocation loc;
                Digest d;

                if (sqlite3_column_bytes(q, 0) != sizeof d.bytes)
                        continue;
                memcpy(d.bytes, sqlite3_column_blob(q, 0), sizeof d.bytes);
                if (block_lookup(s, &d, &loc) >= 0)
                        continue;
                block_count_corruption(s);
                stats->blocks_damaged++;
                digest_to_hex(&d, damage.digest);
                if (cb) {
                        r = report_users(s, &d, &damage, cb, userdata, stats);
                        if (r < 0)
                                return r;
                }
        }
        return r;
}

/* Every live layer's records once, then the damage by subvolume. */
static int scrub_layers(Store *s, store_damage_cb cb, void *userdata, StoreScrubStats *stats) {
        _cleanup_(ZSTD_freeDCtxp) ZSTD_DCtx *dctx = ZSTD_createDCtx();
        _cleanup_free_ void *buf = malloc(INLINE_MAX);
        _cleanup_free_ uint64_t *layers = NULL;
        DamageList list = {};
        size_t n = 0;
        int r;

        if (!dctx || !buf)
                return -ENOMEM;
        r = catalog_live_layers(s, &layers, &n);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = scrub_layer(s, layers[i], dctx, buf, stats, &list);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = report_unindexed_blocks(s, layers[i], cb, userdata, stats);
        if (r >= 0 && list.n > 0)
                r = for_each_stack(s, report_damaged_rows,
                                   &(DamagedRowsReport) { .list = &list,
                                                          .rep = { .cb = cb, .userdata = userdata, .stats = stats } });
        free(list.rows);
        return r;
}

static const struct {
        const char *name;
        const char *reason;
} catalog_record_kinds[] = {
        [CATALOG_RECORD_SUBVOLUME] = { "subvolume", "damaged catalog record of a subvolume" },
        [CATALOG_RECORD_LAYER] = { "layer", "damaged catalog record of a layer" },
        [CATALOG_RECORD_META] = { "setting", "damaged catalog record of a setting of the store" },
        [CATALOG_RECORD_COUNTER] = { "counter", "damaged catalog record of a counter of the store" },
        [CATALOG_RECORD_PACK] = { "pack", "damaged catalog record of a pack file" },
};

/* "subvolume 3", "setting reaper_rate": a damaged record of the catalog. */
static void catalog_record_name(const CatalogDamage *d, char *buf, size_t size) {
        const char *kind = catalog_record_kinds[d->kind].name;

        if (d->kind == CATALOG_RECORD_META || d->kind == CATALOG_RECORD_COUNTER)
                snprintf(buf, size, "%s %s", kind, d->name ?: "?");
        else
                snprintf(buf, size, "%s %" PRIu64, kind, d->id);
}

/* The catalog's records: each damaged one is reported with the subvolume
 * it names, or none for another's. */
static int scrub_catalog(Store *s, store_damage_cb cb, void *userdata, StoreScrubStats *stats) {
        CatalogDamage *damage = NULL;
        uint64_t checked = 0;
        size_t n = 0;
        int r;

        r = catalog_damaged_records(s, false, &damage, &n, &checked);
        if (r < 0)
                return r;
        stats->rows_checked += checked;
        stats->rows_damaged += n;
        stats->catalog_rows_damaged += n;
        for (size_t i = 0; i < n; i++) {
                StoreDamage d = {
                        .reason = catalog_record_kinds[damage[i].kind].reason,
                        .subvolume = damage[i].kind == CATALOG_RECORD_SUBVOLUME ? damage[i].name : NULL,
                };
                char what[sizeof d.digest - 8];

                block_count_corruption(s);
                catalog_record_name(&damage[i], what, sizeof what);
                snprintf(d.digest, sizeof d.digest, "catalog %s", what);
                if (cb)
                        cb(&d, userdata);
        }
        catalog_damage_array_free(damage, n);
        return 0;
}

int store_scrub(Store *s, store_damage_cb cb, store_progress_cb progress, void *userdata, StoreScrubStats *ret) {
        _cleanup_free_ BlockRow *rows = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        _cleanup_close_ int reaping = -EBADF;
        StoreScrubStats stats = {};
        uint64_t total = 0, progress_usec = 0;
        size_t n = 0;
        int r;

        /* A reaper frees blocks and drops layers: what it took away would
         * read as damage. */
        reaping = reaper_lock(s, true, "scrub", NULL);
        if (reaping < 0)
                return reaping;
        buf = malloc(STORE_BLOCK_SIZE);
        if (!buf)
                return -ENOMEM;
        r = scrub_catalog(s, cb, userdata, &stats);
        if (r < 0)
                return r;
        r = catalog_list_blocks(s, 0, &rows, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                total += rows[i].loc.raw_len;

        for (size_t i = 0; i < n; i++) {
                const char *reason = NULL;
                StoreDamage damage;

                if (progress && ratelimit_due(&progress_usec, SCRUB_PROGRESS_USEC, i == 0))
                        progress(stats.bytes_checked, total, userdata);
                r = block_read_at_reason(s, &rows[i].digest, &rows[i].loc, buf, &reason);
                stats.blocks_checked++;
                stats.bytes_checked += rows[i].loc.raw_len;
                if (r >= 0)
                        continue;
                if (r != -EIO)
                        return r;

                block_count_corruption(s);
                block_mark_damaged(s, &rows[i].digest);
                stats.blocks_damaged++;
                damage = (StoreDamage) {
                        .pack = rows[i].loc.pack,
                        .offset = rows[i].loc.offset,
                        .reason = reason ?: "unreadable",
                };
                digest_to_hex(&rows[i].digest, damage.digest);
                if (cb) {
                        r = report_users(s, &rows[i].digest, &damage, cb, userdata, &stats);
                        if (r < 0)
                                return r;
                }
        }
        r = scrub_layers(s, cb, userdata, &stats);
        if (r < 0)
                return r;
        if (progress)
                progress(total, total, userdata);
        if (ret)
                *ret = stats;
        return 0;
}

/* One table of every layer of a stack, read in key order as if it were one
 * table: for each key, the row of the topmost layer that has it. The
 * layers' cursors sit in a heap ordered by key, then by layer, so a row
 * costs a comparison for each level of the heap instead of a lookup in
 * each layer: a stack hundreds of layers deep is read in one pass. */
typedef int (*row_compare_fn)(sqlite3_stmt *a, sqlite3_stmt *b);

typedef struct StackMerge {
        sqlite3_stmt **cursors;         /* one per layer, NULL where none */
        size_t *heap;                   /* the layers whose cursor is on a row */
        size_t n, n_heap;
        row_compare_fn compare;
        bool on_row;                    /* the heap's top is the row last returned */
} StackMerge;

static void stack_merge_done(StackMerge *m) {
        for (size_t i = 0; m->cursors && i < m->n; i++)
                sqlite3_finalize(m->cursors[i]);
        free(m->cursors);
        free(m->heap);
        *m = (StackMerge) {};
}

static bool merge_before(const StackMerge *m, size_t a, size_t b) {
        int c = m->compare(m->cursors[a], m->cursors[b]);

        return c < 0 || (c == 0 && a < b);
}

static void merge_swap(StackMerge *m, size_t i, size_t j) {
        size_t t = m->heap[i];

        m->heap[i] = m->heap[j];
        m->heap[j] = t;
}

static size_t merge_pop(StackMerge *m) {
        size_t top = m->heap[0], i = 0;

        m->heap[0] = m->heap[--m->n_heap];
        for (;;) {
                size_t least = i, left = 2 * i + 1, right = left + 1;

                if (left < m->n_heap && merge_before(m, m->heap[left], m->heap[least]))
                        least = left;
                if (right < m->n_heap && merge_before(m, m->heap[right], m->heap[least]))
                        least = right;
                if (least == i)
                        return top;
                merge_swap(m, i, least);
                i = least;
        }
}

/* Moves the layer's cursor to its next row, and back into the heap if it
 * has one. */
static int merge_step(StackMerge *m, size_t layer) {
        size_t i = m->n_heap;
        int r;

        r = sqlite_step_row(m->cursors[layer]);
        if (r <= 0)
                return r;
        m->heap[m->n_heap++] = layer;
        while (i > 0 && merge_before(m, m->heap[i], m->heap[(i - 1) / 2])) {
                merge_swap(m, i, (i - 1) / 2);
                i = (i - 1) / 2;
        }
        return 0;
}

static int stack_merge_open(const Stack *st, const char *sql, row_compare_fn compare, StackMerge *ret) {
        int r;

        *ret = (StackMerge) {
                .cursors = calloc(MAX(st->n, 1u), sizeof *ret->cursors),
                .heap = calloc(MAX(st->n, 1u), sizeof *ret->heap),
                .n = st->n,
                .compare = compare,
        };
        if (!ret->cursors || !ret->heap)
                return -ENOMEM;
        for (size_t i = 0; i < st->n; i++) {
                if (!st->dbs[i])
                        continue;
                r = sqlite_prepare(st->dbs[i], sql, &ret->cursors[i]);
                if (r < 0)
                        return r;
                r = merge_step(ret, i);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The topmost row of the next key: 1 and its cursor in *ret, 0 at the end. */
static int stack_merge_next(StackMerge *m, sqlite3_stmt **ret) {
        int r;

        if (m->on_row) {
                size_t top = merge_pop(m);

                /* The rows of the same key below it are hidden: they move on
                 * while its own row can still be compared with. */
                while (m->n_heap > 0 && m->compare(m->cursors[m->heap[0]], m->cursors[top]) == 0) {
                        r = merge_step(m, merge_pop(m));
                        if (r < 0)
                                return r;
                }
                r = merge_step(m, top);
                if (r < 0)
                        return r;
        }
        m->on_row = m->n_heap > 0;
        if (!m->on_row)
                return 0;
        *ret = m->cursors[m->heap[0]];
        return 1;
}

/* SQLite's order: integers as signed, blobs by memcmp() and then length. */
static int compare_int64(int64_t x, int64_t y) {
        return x < y ? -1 : x > y;
}

static int compare_inode_rows(sqlite3_stmt *a, sqlite3_stmt *b) {
        return compare_int64(sqlite3_column_int64(a, 0), sqlite3_column_int64(b, 0));
}

static int compare_dentry_rows(sqlite3_stmt *a, sqlite3_stmt *b) {
        int c = compare_int64(sqlite3_column_int64(a, 0), sqlite3_column_int64(b, 0));
        const void *p, *q;
        int x, y;

        if (c != 0)
                return c;
        p = sqlite3_column_blob(a, 1);
        q = sqlite3_column_blob(b, 1);
        x = sqlite3_column_bytes(a, 1);
        y = sqlite3_column_bytes(b, 1);
        if (MIN(x, y) > 0)
                c = memcmp(p, q, (size_t) MIN(x, y));
        return c != 0 ? c : compare_int64(x, y);
}

/* ---- fsck ---- */

typedef struct Fsck {
        Store *store;
        bool repair;
        store_problem_cb cb;
        store_progress_cb progress;
        void *userdata;
        int unrepaired;
        /* Bytes of databases checked, of those to check: the catalog and
         * every live layer, then each subvolume's layers again as its
         * tree is walked. */
        uint64_t done, total, progress_usec;
        /* Stacks found without problems: a snapshot whose own layers are
         * still empty holds the same tree, and is not walked again. */
        StackLayers *clean;
        size_t n_clean, allocated_clean;
        LayerPool pool;
} Fsck;

static void fsck_done(Fsck *f) {
        for (size_t i = 0; i < f->n_clean; i++)
                free(f->clean[i].ids);
        free(f->clean);
        layer_pool_done(&f->pool);
}

static void fsck_advance(Fsck *f, uint64_t bytes) {
        f->done += bytes;
        if (f->progress && ratelimit_due(&f->progress_usec, SCRUB_PROGRESS_USEC, false))
                f->progress(MIN(f->done, f->total), f->total, f->userdata);
}

/* Progress inside one long step of fsck (a layer's check, a tree's walk):
 * SQLite calls back every few thousand of its steps, and the share of the
 * step done is taken to be what the step's databases read from the disk
 * so far (their page cache misses) over how many times the step reads
 * them through. A guess that moves, never past the step's own bytes; the
 * step's end counts them exactly. */
typedef struct FsckStep {
        Fsck *fsck;
        sqlite3 *const *dbs;
        size_t n_dbs;
        uint64_t bytes;
        unsigned passes;
        uint64_t page_size;
        bool installed;
} FsckStep;

#define FSCK_STEP_TICK 50000

static int fsck_step_tick(void *userdata) {
        FsckStep *step = userdata;
        Fsck *f = step->fsck;
        uint64_t read = 0;

        if (!ratelimit_due(&f->progress_usec, SCRUB_PROGRESS_USEC, false))
                return 0;
        for (size_t i = 0; i < step->n_dbs; i++) {
                int misses = 0, highest = 0;

                if (step->dbs[i] &&
                    sqlite3_db_status(step->dbs[i], SQLITE_DBSTATUS_CACHE_MISS, &misses, &highest, false) == SQLITE_OK)
                        read += (uint64_t) misses * step->page_size;
        }
        f->progress(MIN(f->done + MIN(read / step->passes, step->bytes), f->total), f->total, f->userdata);
        return 0;       /* go on */
}

static void fsck_step_begin(FsckStep *step, Fsck *f, sqlite3 *const *dbs, size_t n_dbs, uint64_t bytes,
                            unsigned passes) {
        int64_t page_size = 0;

        *step = (FsckStep) { .fsck = f, .dbs = dbs, .n_dbs = n_dbs, .bytes = bytes, .passes = passes };
        /* An armed fault injection has the handler of every connection. */
        if (!f->progress || sqlite_fault_left() > 0)
                return;
        step->installed = true;
        for (size_t i = 0; i < n_dbs; i++) {
                if (!dbs[i])
                        continue;
                if (step->page_size == 0 && sqlite_query_int(dbs[i], "PRAGMA page_size", &page_size) >= 0)
                        step->page_size = (uint64_t) MAX(page_size, (int64_t) 0);
                sqlite3_progress_handler(dbs[i], FSCK_STEP_TICK, fsck_step_tick, step);
        }
}

static void fsck_step_end(FsckStep *step) {
        for (size_t i = 0; step->installed && i < step->n_dbs; i++)
                if (step->dbs[i])
                        sqlite3_progress_handler(step->dbs[i], 0, NULL, NULL);
}

/* What a walk of the subvolume reads: its layers' databases. */
static int stack_bytes(Store *s, const SubvolumeRecord *rec, uint64_t *ret) {
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0;
        int r;

        *ret = 0;
        r = catalog_layer_stack(s, rec->top_layer, &ids, &n);
        if (r == -EUCLEAN)
                return 0;       /* a broken stack: its check reports it */
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                *ret += layer_file_bytes(s, ids[i]);
        return 0;
}

static uint64_t catalog_file_bytes(Store *s) {
        struct stat st;

        return fstatat(s->dir_fd, "catalog.db", &st, 0) >= 0 ? (uint64_t) st.st_size : 0;
}

_printf_(3, 4)
static void problem(Fsck *f, bool repaired, const char *format, ...) {
        _cleanup_free_ char *text = NULL, *line = NULL;
        va_list ap;

        va_start(ap, format);
        if (vasprintf(&text, format, ap) < 0)
                text = NULL;
        va_end(ap);
        if (!repaired)
                f->unrepaired++;
        if (f->cb && text && asprintf(&line, "%s%s", text, repaired ? " (repaired)" : "") >= 0)
                f->cb(line, f->userdata);
}

static int check_integrity(Fsck *f, sqlite3 *db, const char *what) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(db, "PRAGMA quick_check", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                const char *msg = (const char *) sqlite3_column_text(st, 0);

                if (msg && !streq(msg, "ok"))
                        problem(f, false, "%s: %s", what, msg);
        }
        return r;
}

#define REBUILD_BLOCKREFS(check_column, check)                                                            \
        "BEGIN;"                                                                                          \
        "CREATE TEMP TABLE lens AS SELECT digest, stored_len FROM blockrefs;"                            \
        BLOCKREFS_FROM_EXTENTS("", check_column, check)                                                   \
        "COMMIT;"

/* The layer's block set must be what its extents reference, each block in
 * the index; every record must pass its checksum. */
static int check_layer_blocks(Fsck *f, uint64_t id, uint64_t bytes) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_(fsck_step_end) FsckStep step = {};
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        char what[64];
        int64_t mismatched = 0, damaged = 0;
        int r;

        snprintf(what, sizeof what, "layer %" PRIu64, id);
        r = layer_exists(f->store, id);
        if (r < 0)
                return r;
        if (r == 0) {
                r = catalog_layer_was_made(f->store, id);
                if (r > 0)
                        problem(f, false, "%s: its database is missing: what its subvolumes held in it is lost "
                                "(they are named below)", what);
                return r < 0 ? r : 0;
        }
        /* Read-write, in whatever journal mode it is in: a sealed layer
         * stays without a WAL when repaired. */
        r = layer_open(f->store, id, LAYER_READ, &db);
        if (r == -EUCLEAN)
                goto unreadable;
        if (r < 0)
                return r;
        /* quick_check, the record checks, the counts, the references. */
        fsck_step_begin(&step, f, &db, 1, bytes, 4);
        r = check_integrity(f, db, what);
        if (r == -EUCLEAN)
                goto unreadable;
        if (r < 0)
                return r;
        r = layer_count_damaged_rows(db, "main", &damaged);
        if (r < 0)
                return r;
        if (damaged > 0)
                problem(f, false, "%s: %" PRId64 " records fail their checksum ('scrub' names the files)", what, damaged);

        r = sqlite_query_int(db,
                             "SELECT count(*) FROM (SELECT digest, count(*) AS n FROM extents WHERE digest IS NOT NULL "
                             "GROUP BY digest) e FULL JOIN blockrefs b USING (digest) "
                             "WHERE e.n IS NOT b.refs",
                             &mismatched);
        if (r < 0)
                return r;
        if (mismatched > 0) {
                bool fixed = false;

                /* Rebuilt from the extents; a damaged extent stays damaged. */
                if (f->repair)
                        fixed = sqlite_exec(db, layer_has_row_checks(db, "main") ? REBUILD_BLOCKREFS(", row_check", ", " BLOCKREF_CHECK)
                                                                          : REBUILD_BLOCKREFS("", "")) >= 0;
                problem(f, fixed, "%s: %" PRId64 " block reference counts disagree with its extents", what, mismatched);
        }

        r = sqlite_prepare(db, "SELECT digest FROM blockrefs", &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                BlockLocation loc;
                Digest d;
                char hex[33];

                if (sqlite3_column_bytes(st, 0) != sizeof d.bytes)
                        continue;
                memcpy(d.bytes, sqlite3_column_blob(st, 0), sizeof d.bytes);
                if (block_lookup(f->store, &d, &loc) >= 0)
                        continue;
                digest_to_hex(&d, hex);
                problem(f, false, "%s references block %s, which the block index lacks: its data is lost", what, hex);
        }
        return r;

unreadable:
        problem(f, false, "%s: its database cannot be read (damaged beyond its records' checks): what its "
                "subvolumes held in it is lost (they are named below)", what);
        return 0;
}

/* A stack's tree as fsck counts it: the topmost row of each inode, by
 * number, and the entries that win (not whiteouts), by parent. */
typedef struct TreeInode {
        int64_t ino;
        uint64_t size;
        uint32_t mode;
        bool reached;
} TreeInode;

typedef struct TreeEntry {
        int64_t parent;
        size_t child;           /* its index in inodes */
} TreeEntry;

typedef struct StackTree {
        TreeInode *inodes;
        size_t n_inodes, allocated_inodes;
        TreeEntry *entries;
        size_t n_entries, allocated_entries;
} StackTree;

static void stack_tree_done(StackTree *t) {
        free(t->inodes);
        free(t->entries);
}

static TreeInode *tree_inode(const StackTree *t, int64_t ino) {
        size_t lo = 0, hi = t->n_inodes;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (t->inodes[mid].ino == ino)
                        return &t->inodes[mid];
                if (t->inodes[mid].ino < ino)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return NULL;
}

/* The index of the first entry of dir, or where it would be. */
static size_t tree_first_entry(const StackTree *t, int64_t dir) {
        size_t lo = 0, hi = t->n_entries;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (t->entries[mid].parent < dir)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

static int tree_read_inodes(const Stack *st, StackTree *t) {
        _cleanup_(stack_merge_done) StackMerge m = {};
        sqlite3_stmt *q;
        int r;

        r = stack_merge_open(st, "SELECT ino, mode, size FROM inodes ORDER BY ino", compare_inode_rows, &m);
        while (r >= 0 && (r = stack_merge_next(&m, &q)) > 0) {
                if (!GREEDY_REALLOC(t->inodes, t->allocated_inodes, t->n_inodes + 1))
                        return -ENOMEM;
                t->inodes[t->n_inodes++] = (TreeInode) {
                        .ino = sqlite3_column_int64(q, 0),
                        .mode = (uint32_t) sqlite3_column_int64(q, 1),
                        .size = (uint64_t) sqlite3_column_int64(q, 2),
                };
        }
        return r;
}

/* Reads the entries that win; one that names no inode is a problem. */
static int fsck_read_entries(Fsck *f, const SubvolumeRecord *rec, const Stack *st, StackTree *t) {
        _cleanup_(stack_merge_done) StackMerge m = {};
        sqlite3_stmt *q;
        int r;

        r = stack_merge_open(st, "SELECT parent, name, ino FROM dentries ORDER BY parent, name", compare_dentry_rows,
                             &m);
        while (r >= 0 && (r = stack_merge_next(&m, &q)) > 0) {
                int64_t ino = sqlite3_column_int64(q, 2);
                TreeInode *child;

                if (ino == 0)
                        continue;       /* a whiteout: the name is gone */
                child = tree_inode(t, ino);
                if (!child) {
                        problem(f, false, "subvolume '%s': entry '%.*s' names inode %" PRIi64 ", which is missing",
                                rec->name, sqlite3_column_bytes(q, 1), (const char *) sqlite3_column_blob(q, 1), ino);
                        continue;
                }
                if (!GREEDY_REALLOC(t->entries, t->allocated_entries, t->n_entries + 1))
                        return -ENOMEM;
                t->entries[t->n_entries++] = (TreeEntry) {
                        .parent = sqlite3_column_int64(q, 0),
                        .child = (size_t) (child - t->inodes),
                };
        }
        return r;
}

/* What the counters of a subvolume's top layer say, and what its layers
 * hold. */
typedef struct Census {
        LayerCounters counters;
        bool counters_damaged;
        uint64_t highest;       /* the highest inode number of any layer */
        uint64_t inodes, logical;
        int64_t linked_dir;     /* a directory with two names, 0 if none */
} Census;

/* What the volume counts: the inodes reachable from the root through the
 * entries that win, each once (hard links), and the bytes of the regular
 * files among them. Those left without a name (nlink 0) left the counters
 * when they lost it. */
static int tree_census(StackTree *t, Census *c) {
        _cleanup_free_ int64_t *dirs = calloc(t->n_inodes + 1, sizeof *dirs);
        TreeInode *root = tree_inode(t, 1);
        size_t n_dirs = 0;

        if (!dirs)
                return -ENOMEM;
        dirs[n_dirs++] = 1;
        if (root) {
                root->reached = true;
                c->inodes++;
        }
        for (size_t k = 0; k < n_dirs; k++)
                for (size_t e = tree_first_entry(t, dirs[k]); e < t->n_entries && t->entries[e].parent == dirs[k];
                     e++) {
                        TreeInode *child = &t->inodes[t->entries[e].child];

                        if (child->reached) {
                                /* A file's hard link; a directory has one name. */
                                if (S_ISDIR(child->mode) && c->linked_dir == 0)
                                        c->linked_dir = child->ino;
                                continue;
                        }
                        child->reached = true;
                        c->inodes++;
                        if (S_ISREG(child->mode))
                                c->logical += child->size;
                        else if (S_ISDIR(child->mode))
                                dirs[n_dirs++] = child->ino;
                }
        return 0;
}

/* One database: the census in one query, and the entries that name no
 * inode in another. Rows that nothing reaches (unlinked while open; a
 * fold keeps the rows of inodes dropped above it) do not count. */
static int fsck_census_one(Fsck *f, const SubvolumeRecord *rec, sqlite3 *db, Census *c) {
        _cleanup_stmt_ sqlite3_stmt *totals = NULL, *missing = NULL;
        int r;

        r = sqlite_prepare(db,
                           "WITH RECURSIVE reach(ino) AS (SELECT 1 UNION SELECT d.ino FROM dentries d "
                           "  JOIN reach ON d.parent = reach.ino WHERE d.ino != 0) "
                           "SELECT count(*), coalesce(sum(CASE WHEN mode & ?1 = ?2 THEN size END), 0) "
                           "FROM inodes WHERE ino IN reach", &totals);
        if (r < 0)
                return r;
        sqlite3_bind_int64(totals, 1, S_IFMT);
        sqlite3_bind_int64(totals, 2, S_IFREG);
        r = sqlite_step_row(totals);
        if (r < 0)
                return r;
        c->inodes = r > 0 ? (uint64_t) sqlite3_column_int64(totals, 0) : 0;
        c->logical = r > 0 ? (uint64_t) sqlite3_column_int64(totals, 1) : 0;

        r = sqlite_prepare(db,
                           "SELECT name, ino FROM dentries d WHERE ino != 0 AND "
                           "NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = d.ino)", &missing);
        while (r >= 0 && (r = sqlite_step_row(missing)) > 0)
                problem(f, false, "subvolume '%s': entry '%.*s' names inode %" PRIi64 ", which is missing", rec->name,
                        sqlite3_column_bytes(missing, 0), (const char *) sqlite3_column_blob(missing, 0),
                        (int64_t) sqlite3_column_int64(missing, 1));
        return r;
}

/* Several: the tree read in one pass over each table of every layer. */
static int fsck_census_stack(Fsck *f, const SubvolumeRecord *rec, const Stack *st, Census *c) {
        _cleanup_(stack_tree_done) StackTree t = {};
        int r;

        r = tree_read_inodes(st, &t);
        if (r >= 0)
                r = fsck_read_entries(f, rec, st, &t);
        if (r >= 0)
                r = tree_census(&t, c);
        return r;
}

/* The counters and the rows in one read transaction: a server that
 * commits meanwhile changes both at once. */
static int fsck_census(Fsck *f, const SubvolumeRecord *rec, const Stack *st, size_t databases, Census *c) {
        int r;

        *c = (Census) {};
        r = stack_read_begin(st);
        if (r < 0)
                return r;
        r = layer_read_counters(stack_top_db(st), &c->counters);
        c->counters_damaged = r == -EIO;
        if (c->counters_damaged)
                r = 0;
        for (size_t i = 0; r >= 0 && i < st->n; i++) {
                uint64_t v = 0;

                if (!st->dbs[i])
                        continue;
                r = layer_highest_ino(st->dbs[i], &v);
                c->highest = MAX(c->highest, v);
        }
        if (r >= 0)
                r = databases == 1 ? fsck_census_one(f, rec, stack_top_db(st), c) : fsck_census_stack(f, rec, st, c);
        stack_read_end(st);
        return r;
}

/* The counters of the topmost layer that has a database, the ones read,
 * must say what the layers hold. The next inode number must be above every
 * one the subvolume has: else a new file takes the number, and the rows,
 * of an old one (a fold of two never-written layers once left an empty
 * subvolume's counters on top). Quotas and usage are read from the counts
 * of inodes and bytes. */
static void check_counters(Fsck *f, const SubvolumeRecord *rec, const Stack *st, const Census *census) {
        const LayerCounters *c = &census->counters;
        LayerCounters mended = *c;
        bool ino_taken, counts_wrong, fixed = false;

        if (census->counters_damaged)
                return;         /* a damaged record: the checksum count reports it */
        ino_taken = c->next_ino <= census->highest;
        counts_wrong = c->inodes != census->inodes || c->logical_bytes != census->logical;
        if (!ino_taken && !counts_wrong)
                return;
        if (f->repair) {
                if (ino_taken)
                        mended.next_ino = census->highest + 1;
                mended.inodes = census->inodes;
                mended.logical_bytes = census->logical;
                fixed = layer_write_counters(stack_top_db(st), &mended) >= 0;
        }
        if (ino_taken)
                problem(f, fixed, "subvolume '%s': the next inode number, %" PRIu64 ", is taken (its inodes go up to "
                        "%" PRIu64 "): a new file would take the place of an existing one", rec->name, c->next_ino,
                        census->highest);
        if (counts_wrong)
                problem(f, fixed, "subvolume '%s': its counters say %" PRIu64 " inodes and %" PRIu64 " bytes, its layers "
                        "hold %" PRIu64 " and %" PRIu64, rec->name, c->inodes, c->logical_bytes, census->inodes,
                        census->logical);
}

/* Every visible entry of the subvolume names an inode that exists, no
 * directory has two names, and the counters say what the layers hold. */
static int check_subvolume(Fsck *f, const SubvolumeRecord *rec, uint64_t bytes) {
        _cleanup_(stack_done) Stack st = {};
        _cleanup_(fsck_step_end) FsckStep step = {};
        StackLayers layers;
        Census census;
        size_t databases = 0;
        int r, unrepaired = f->unrepaired;

        r = stack_open(f->store, rec, &f->pool, &st);
        if (r == -EUCLEAN) {
                problem(f, false, "subvolume '%s': its layer stack is broken", rec->name);
                return 0;
        }
        if (r < 0)
                return r;
        /* Its tree is not all there: nothing of it is checked, or repaired
         * to agree with what is left. */
        if (st.lost_layer != 0) {
                problem(f, false, "subvolume '%s': layer %" PRIu64 " of its stack is lost: delete the subvolume, "
                        "or restore the store from a backup", rec->name, st.lost_layer);
                return 0;
        }
        for (size_t i = 0; i < st.n; i++)
                databases += st.dbs[i] != NULL;
        if (databases == 0)
                return 0;       /* a broken stack: reported by the caller */
        /* One database is read twice, by the census and by the walk. */
        fsck_step_begin(&step, f, st.dbs, st.n, bytes, databases == 1 ? 2 : 1);
        r = stack_layers(&st, &layers);
        if (r < 0)
                return r;
        for (size_t i = 0; i < f->n_clean; i++)
                if (stack_layers_equal(&f->clean[i], &layers)) {
                        free(layers.ids);
                        return 0;
                }

        r = fsck_census(f, rec, &st, databases, &census);
        if (r >= 0) {
                if (census.linked_dir != 0)
                        problem(f, false, "subvolume '%s': directory inode %" PRIi64 " has more than one name (a "
                                "hard link to a directory, or a loop of directories)", rec->name, census.linked_dir);
                check_counters(f, rec, &st, &census);
        }
        if (r >= 0 && f->unrepaired == unrepaired && GREEDY_REALLOC(f->clean, f->allocated_clean, f->n_clean + 1)) {
                f->clean[f->n_clean++] = layers;
                return 0;
        }
        free(layers.ids);
        return r < 0 ? r : 0;
}

static void subvolume_records_free(SubvolumeRecord *recs, size_t n) {
        for (size_t i = 0; i < n; i++)
                subvolume_record_clear(&recs[i]);
        free(recs);
}

/* The catalog's rows carry no checks of their own: what they must say of
 * writable subvolumes is checked instead. Each has a top layer of its own
 * (the one its writes go to), which no layer is stacked on (a snapshot
 * gives it a new one). A subvolume's top changed by damage to name
 * another's breaks one of these. */
static int check_writable_tops(Fsck *f) {
        _cleanup_stmt_ sqlite3_stmt *shared = NULL, *stacked = NULL;
        int r;

        r = sqlite_prepare(f->store->catalog,
                           "SELECT top_layer, group_concat(name, ', ') FROM subvolumes WHERE deleted = 0 "
                           "GROUP BY top_layer HAVING count(*) > 1 AND min(readonly) = 0", &shared);
        while (r >= 0 && (r = sqlite_step_row(shared)) > 0)
                problem(f, false, "catalog: subvolumes %s share top layer %" PRIi64 ", which one of them writes "
                        "to (the catalog is damaged)", (const char *) sqlite3_column_text(shared, 1),
                        (int64_t) sqlite3_column_int64(shared, 0));
        if (r < 0)
                return r;
        r = sqlite_prepare(f->store->catalog,
                           "SELECT name, top_layer FROM subvolumes s WHERE deleted = 0 AND readonly = 0 AND "
                           "EXISTS (SELECT 1 FROM layers l WHERE l.parent = s.top_layer)", &stacked);
        while (r >= 0 && (r = sqlite_step_row(stacked)) > 0)
                problem(f, false, "catalog: writable subvolume '%s' has top layer %" PRIi64 ", on which other "
                        "layers are stacked (the catalog is damaged)", (const char *) sqlite3_column_text(stacked, 0),
                        (int64_t) sqlite3_column_int64(stacked, 1));
        return r;
}

/* The records of the catalog that fail their checks, each a problem. */
static int check_catalog_records(Fsck *f) {
        CatalogDamage *damage = NULL;
        size_t n = 0;
        int r;

        r = catalog_damaged_records(f->store, false, &damage, &n, NULL);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                char what[64];
                bool mended;

                switch (damage[i].kind) {
                case CATALOG_RECORD_LAYER:
                        problem(f, false, "catalog: the record of layer %" PRIu64 " fails its checksum: the "
                                "subvolumes on it cannot be used, and the reaper frees nothing until they are deleted",
                                damage[i].id);
                        break;
                case CATALOG_RECORD_SUBVOLUME:
                        problem(f, false, "catalog: the record of subvolume %" PRIu64 " ('%s') fails its checksum: "
                                "it cannot be used, and the reaper frees nothing until it is deleted",
                                damage[i].id, damage[i].name ?: "?");
                        break;
                default:
                        catalog_record_name(&damage[i], what, sizeof what);
                        mended = f->repair && catalog_mend_record(f->store, &damage[i]) >= 0;
                        problem(f, mended, "catalog: the record of the %s fails its checksum: it is not used%s",
                                what, mended || f->repair ? "" : " ('fsck --repair' writes it anew)");
                        break;
                }
        }
        catalog_damage_array_free(damage, n);
        return 0;
}

/* The catalog, every live layer, then every subvolume's tree. */
static int fsck_all(Fsck *f, const SubvolumeRecord *recs, size_t n) {
        _cleanup_free_ uint64_t *layers = NULL, *layer_bytes = NULL, *walk_bytes = NULL;
        size_t n_layers = 0;
        uint64_t catalog_bytes;
        int r;

        /* Repairs change layers: none may be served meanwhile. */
        for (size_t i = 0; f->repair && i < n; i++) {
                pid_t holder;

                if (subvolume_lock_holder(f->store, recs[i].id, &holder) > 0)
                        return -EBUSY;
        }
        r = catalog_live_layers(f->store, &layers, &n_layers);
        if (r < 0)
                return r;

        layer_bytes = calloc(MAX(n_layers, 1u), sizeof *layer_bytes);
        walk_bytes = calloc(MAX(n, 1u), sizeof *walk_bytes);
        if (!layer_bytes || !walk_bytes)
                return -ENOMEM;
        catalog_bytes = catalog_file_bytes(f->store);
        f->total = catalog_bytes;
        for (size_t i = 0; i < n_layers; i++) {
                layer_bytes[i] = layer_file_bytes(f->store, layers[i]);
                f->total += layer_bytes[i];
        }
        for (size_t i = 0; i < n; i++) {
                r = stack_bytes(f->store, &recs[i], &walk_bytes[i]);
                if (r < 0)
                        return r;
                f->total += walk_bytes[i];
        }
        if (f->progress)
                f->progress(0, f->total, f->userdata);

        {
                CATALOG_LOCKED(f->store);
                r = check_integrity(f, f->store->catalog, "catalog");
                if (r >= 0)
                        r = check_writable_tops(f);
                if (r < 0)
                        return r;
        }
        r = check_catalog_records(f);
        if (r < 0)
                return r;
        fsck_advance(f, catalog_bytes);
        for (size_t i = 0; i < n_layers; i++) {
                r = check_layer_blocks(f, layers[i], layer_bytes[i]);
                if (r < 0)
                        return r;
                fsck_advance(f, layer_bytes[i]);
        }
        for (size_t i = 0; i < n; i++) {
                r = check_subvolume(f, &recs[i], walk_bytes[i]);
                if (r < 0)
                        return r;
                fsck_advance(f, walk_bytes[i]);
        }
        if (f->progress)
                f->progress(f->total, f->total, f->userdata);
        return 0;
}

int store_fsck(Store *s, bool repair, store_problem_cb cb, store_progress_cb progress, void *userdata) {
        _cleanup_(fsck_done) Fsck f = { .store = s, .repair = repair, .cb = cb, .progress = progress,
                                        .userdata = userdata };
        _cleanup_close_ int reaping = -EBADF;
        SubvolumeRecord *recs = NULL;
        size_t n = 0;
        int r;

        /* A reaper folds and drops layers: what it changed between two
         * reads of fsck would look like a broken store. */
        reaping = reaper_lock(s, true, "fsck", NULL);
        if (reaping < 0)
                return reaping;
        r = catalog_list_subvolumes(s, true, &recs, &n);
        if (r < 0)
                return r;
        r = fsck_all(&f, recs, n);
        subvolume_records_free(recs, n);
        return r < 0 ? r : f.unrepaired;
}
