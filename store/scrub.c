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

/* The layers of a subvolume's stack, opened for reading, with the lookups
 * every entry of a large layer may need prepared once. */
typedef struct Stack {
        char *subvolume;
        uint64_t *ids;
        sqlite3 **dbs;          /* NULL entries: layers without a database */
        sqlite3_stmt **get_dentry;
        sqlite3_stmt **get_inode;       /* mode, size */
        sqlite3_stmt **list_dentries;   /* name, ino of a directory's entries */
        size_t n;
} Stack;

static void stack_done(Stack *st) {
        for (size_t i = 0; i < st->n; i++) {
                if (st->get_dentry)
                        sqlite3_finalize(st->get_dentry[i]);
                if (st->get_inode)
                        sqlite3_finalize(st->get_inode[i]);
                if (st->list_dentries)
                        sqlite3_finalize(st->list_dentries[i]);
                if (st->dbs[i])
                        sqlite3_close_v2(st->dbs[i]);
        }
        free(st->get_dentry);
        free(st->get_inode);
        free(st->list_dentries);
        free(st->dbs);
        free(st->ids);
        free(st->subvolume);
        *st = (Stack) {};
}

static int stack_open(Store *s, const SubvolumeRecord *rec, Stack *ret) {
        int r;

        *ret = (Stack) {};
        ret->subvolume = strdup(rec->name);
        if (!ret->subvolume)
                return -ENOMEM;
        r = catalog_layer_stack(s, rec->top_layer, &ret->ids, &ret->n);
        if (r < 0)
                return r;
        ret->dbs = calloc(ret->n, sizeof *ret->dbs);
        ret->get_dentry = calloc(ret->n, sizeof *ret->get_dentry);
        ret->get_inode = calloc(ret->n, sizeof *ret->get_inode);
        ret->list_dentries = calloc(ret->n, sizeof *ret->list_dentries);
        if (!ret->dbs || !ret->get_dentry || !ret->get_inode || !ret->list_dentries)
                return -ENOMEM;
        for (size_t i = 0; i < ret->n; i++) {
                /* Frozen layers never change: read without locks. */
                bool frozen = i > 0 || rec->readonly;

                r = layer_open(s, ret->ids[i], frozen ? LAYER_READ_FROZEN : LAYER_READ, &ret->dbs[i]);
                if (r == -ENOENT)
                        continue;
                if (r < 0)
                        return r;
                r = sqlite_prepare(ret->dbs[i], "SELECT ino FROM dentries WHERE parent = ?1 AND name = ?2",
                                   &ret->get_dentry[i]);
                if (r < 0)
                        return r;
                r = sqlite_prepare(ret->dbs[i], "SELECT mode, size FROM inodes WHERE ino = ?1", &ret->get_inode[i]);
                if (r < 0)
                        return r;
                r = sqlite_prepare(ret->dbs[i], "SELECT name, ino FROM dentries WHERE parent = ?1",
                                   &ret->list_dentries[i]);
                if (r < 0)
                        return r;
        }
        return 0;
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
                sqlite3_stmt *q = st->get_dentry[i];
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

static int for_each_stack(Store *s, stack_fn fn, void *userdata) {
        _cleanup_free_ SubvolumeRecord *recs = NULL;
        size_t n = 0;
        int r;

        r = catalog_list_subvolumes(s, &recs, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                if (r >= 0) {
                        _cleanup_(stack_done) Stack st = {};

                        r = stack_open(s, &recs[i], &st);
                        if (r >= 0)
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

static int report_block_users(Store *s, const Stack *st, void *userdata) {
        DamageReport *rep = userdata;
        int r = 0;

        for (size_t l = 0; r >= 0 && l < st->n; l++) {
                _cleanup_stmt_ sqlite3_stmt *q = NULL;

                if (!st->dbs[l])
                        continue;
                r = sqlite_prepare(st->dbs[l], "SELECT DISTINCT ino FROM extents WHERE digest = ?1", &q);
                if (r < 0)
                        break;
                sqlite3_bind_blob(q, 1, rep->digest->bytes, sizeof rep->digest->bytes, SQLITE_STATIC);
                while ((r = sqlite_step_row(q)) > 0)
                        report_damage(rep, st, (uint64_t) sqlite3_column_int64(q, 0));
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
                int r;

                if (!st->get_inode[i])
                        continue;
                sqlite3_bind_int64(st->get_inode[i], 1, (sqlite3_int64) ino);
                r = lookup_step(st->get_inode[i], NULL);
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
static int scrub_layer(Store *s, uint64_t id, ZSTD_DCtx *dctx, void *buf, StoreScrubStats *stats,
                       DamageList *list) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        _cleanup_stmt_ sqlite3_stmt *q = NULL;
        int64_t n = 0;
        int r;

        r = layer_open(s, id, LAYER_READ, &db);
        if (r == -ENOENT)
                return 0; /* no database: an empty layer */
        if (r < 0)
                return r;

        r = sqlite_prepare(db, "SELECT ino, data, data_check, data_zstd FROM inodes WHERE data IS NOT NULL", &q);
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
        if (r >= 0 && list.n > 0)
                r = for_each_stack(s, report_damaged_rows,
                                   &(DamagedRowsReport) { .list = &list,
                                                          .rep = { .cb = cb, .userdata = userdata, .stats = stats } });
        free(list.rows);
        return r;
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
} Fsck;

static void fsck_done(Fsck *f) {
        for (size_t i = 0; i < f->n_clean; i++)
                free(f->clean[i].ids);
        free(f->clean);
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

        r = layer_exists(f->store, id);
        if (r <= 0)
                return r;
        /* Read-write, in whatever journal mode it is in: a sealed layer
         * stays without a WAL when repaired. */
        r = layer_open(f->store, id, LAYER_READ, &db);
        if (r < 0)
                return r;
        /* quick_check, the record checks, the counts, the references. */
        fsck_step_begin(&step, f, &db, 1, bytes, 4);
        snprintf(what, sizeof what, "layer %" PRIu64, id);
        r = check_integrity(f, db, what);
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
}

typedef struct IdList {
        uint64_t *ids;
        size_t n, allocated;
} IdList;

static void id_list_done(IdList *l) {
        free(l->ids);
}

static int id_list_add(IdList *l, uint64_t id) {
        if (!GREEDY_REALLOC(l->ids, l->allocated, l->n + 1))
                return -ENOMEM;
        l->ids[l->n++] = id;
        return 0;
}

/* Inodes counted, with the bytes each holds if it is a regular file. */
typedef struct CountedInode {
        uint64_t ino;
        uint64_t bytes;
} CountedInode;

typedef struct CountedList {
        CountedInode *items;
        size_t n, allocated;
} CountedList;

static void counted_list_done(CountedList *l) {
        free(l->items);
}

static int counted_list_add(CountedList *l, uint64_t ino, uint32_t mode, uint64_t size) {
        if (!GREEDY_REALLOC(l->items, l->allocated, l->n + 1))
                return -ENOMEM;
        l->items[l->n++] = (CountedInode) { .ino = ino, .bytes = S_ISREG(mode) ? size : 0 };
        return 0;
}

static int counted_compare(const void *a, const void *b) {
        uint64_t x = ((const CountedInode *) a)->ino, y = ((const CountedInode *) b)->ino;

        return x < y ? -1 : x > y;
}

typedef struct ChildRow {
        void *name;
        int len;
        uint64_t ino;
        size_t layer;
} ChildRow;

static int child_row_compare(const void *a, const void *b) {
        const ChildRow *x = a, *y = b;
        int c = memcmp(x->name, y->name, (size_t) MIN(x->len, y->len));

        if (c != 0)
                return c;
        if (x->len != y->len)
                return x->len < y->len ? -1 : 1;
        return x->layer < y->layer ? -1 : x->layer > y->layer;
}

/* The topmost row of ino: 1 with its mode and size, 0 if no layer has one. */
static int stack_inode(const Stack *st, uint64_t ino, uint32_t *ret_mode, uint64_t *ret_size) {
        for (size_t i = 0; i < st->n; i++) {
                sqlite3_stmt *q = st->get_inode[i];
                int r;

                if (!q)
                        continue;
                sqlite3_bind_int64(q, 1, (sqlite3_int64) ino);
                r = sqlite_step_row(q);
                if (r > 0) {
                        *ret_mode = (uint32_t) sqlite3_column_int64(q, 0);
                        *ret_size = (uint64_t) sqlite3_column_int64(q, 1);
                }
                sqlite3_reset(q);
                if (r != 0)
                        return r;
        }
        return 0;
}

/* Adds the children of dir that win (the topmost entry of each name; a
 * whiteout hides the name) to all, and those that are directories to dirs. */
static int census_children(const Stack *st, uint64_t dir, CountedList *all, IdList *dirs) {
        ChildRow *rows = NULL;
        size_t n = 0, allocated = 0;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < st->n; i++) {
                sqlite3_stmt *q = st->list_dentries[i];

                if (!q)
                        continue;
                sqlite3_bind_int64(q, 1, (sqlite3_int64) dir);
                while ((r = sqlite_step_row(q)) > 0) {
                        int len = sqlite3_column_bytes(q, 0);
                        void *name = malloc((size_t) MAX(len, 1));

                        if (!name || !GREEDY_REALLOC(rows, allocated, n + 1)) {
                                free(name);
                                r = -ENOMEM;
                                break;
                        }
                        memcpy(name, sqlite3_column_blob(q, 0), (size_t) len);
                        rows[n++] = (ChildRow) {
                                .name = name,
                                .len = len,
                                .ino = (uint64_t) sqlite3_column_int64(q, 1),
                                .layer = i,
                        };
                }
                sqlite3_reset(q);
        }
        if (r >= 0 && n > 0)
                qsort(rows, n, sizeof *rows, child_row_compare);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                uint32_t mode = 0;
                uint64_t size;

                if ((i > 0 && rows[i].len == rows[i - 1].len &&
                     memcmp(rows[i].name, rows[i - 1].name, (size_t) rows[i].len) == 0) || rows[i].ino == 0)
                        continue;       /* hidden by the entry above, or a whiteout */
                r = stack_inode(st, rows[i].ino, &mode, &size);
                if (r <= 0)
                        continue;       /* missing: reported with its entry */
                r = counted_list_add(all, rows[i].ino, mode, size);
                if (r >= 0 && S_ISDIR(mode))
                        r = id_list_add(dirs, rows[i].ino);
        }
        for (size_t i = 0; i < n; i++)
                free(rows[i].name);
        free(rows);
        return r < 0 ? r : 0;
}

/* What the volume counts: the inodes reachable from the root through the
 * entries that win, each once, and the bytes of the regular files among
 * them. Those left without a name (nlink 0) left the counters when they
 * lost it. */
static int stack_census(const Stack *st, uint64_t *ret_inodes, uint64_t *ret_logical) {
        _cleanup_(counted_list_done) CountedList all = {};
        _cleanup_(id_list_done) IdList dirs = {};
        uint64_t entries = 0, inodes = 0, logical = 0;
        size_t databases = 0;
        int r;

        /* One database: the same census in one query. Rows that nothing
         * reaches (unlinked while open; a fold keeps the rows of inodes
         * dropped above it) do not count. */
        for (size_t i = 0; i < st->n; i++)
                databases += st->dbs[i] != NULL;
        if (databases == 1)
                for (size_t i = 0; i < st->n; i++) {
                        _cleanup_stmt_ sqlite3_stmt *totals = NULL;

                        if (!st->dbs[i])
                                continue;
                        r = sqlite_prepare(st->dbs[i],
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
                        *ret_inodes = r > 0 ? (uint64_t) sqlite3_column_int64(totals, 0) : 0;
                        *ret_logical = r > 0 ? (uint64_t) sqlite3_column_int64(totals, 1) : 0;
                        return 0;
                }

        for (size_t i = 0; i < st->n; i++) {
                int64_t v = 0;

                if (!st->dbs[i])
                        continue;
                r = sqlite_query_int(st->dbs[i], "SELECT count(*) FROM dentries", &v);
                if (r < 0)
                        return r;
                entries += (uint64_t) v;
        }

        {
                uint32_t mode = 0;
                uint64_t size = 0;

                r = stack_inode(st, 1, &mode, &size);
                if (r > 0)
                        r = counted_list_add(&all, 1, mode, size);
                if (r >= 0)
                        r = id_list_add(&dirs, 1);
        }
        for (size_t k = 0; r >= 0 && k < dirs.n; k++) {
                /* A tree has fewer directories than entries: more is a loop. */
                if (dirs.n > entries + 1)
                        r = -ELOOP;
                else
                        r = census_children(st, dirs.ids[k], &all, &dirs);
        }
        if (r < 0)
                return r;

        if (all.n > 0)
                qsort(all.items, all.n, sizeof *all.items, counted_compare);
        for (size_t i = 0; i < all.n; i++) {
                if (i > 0 && all.items[i].ino == all.items[i - 1].ino)
                        continue;       /* hard links */
                inodes++;
                logical += all.items[i].bytes;
        }
        *ret_inodes = inodes;
        *ret_logical = logical;
        return 0;
}

/* The counters of the topmost layer that has a database, the ones read,
 * must say what the layers hold. The next inode number must be above every
 * one the subvolume has: else a new file takes the number, and the rows,
 * of an old one (a fold of two never-written layers once left an empty
 * subvolume's counters on top). Quotas and usage are read from the counts
 * of inodes and bytes. */
static int check_counters(Fsck *f, const SubvolumeRecord *rec, const Stack *st) {
        sqlite3 *top = stack_top_db(st);
        LayerCounters c, mended;
        uint64_t highest = 0, inodes = 0, logical = 0;
        bool ino_taken, counts_wrong, damaged, fixed = false;
        int r;

        if (!top)
                return 0;       /* a broken stack: reported by the caller */
        /* The counters and the rows in one read transaction: a server that
         * commits meanwhile changes both at once. */
        r = stack_read_begin(st);
        if (r < 0)
                return r;
        r = layer_read_counters(top, &c);
        damaged = r == -EIO;
        for (size_t i = 0; r >= 0 && i < st->n; i++) {
                uint64_t v = 0;

                if (!st->dbs[i])
                        continue;
                r = layer_highest_ino(st->dbs[i], &v);
                highest = MAX(highest, v);
        }
        if (r >= 0)
                r = stack_census(st, &inodes, &logical);
        stack_read_end(st);
        if (damaged)
                return 0;       /* a damaged record: the checksum count reports it */
        if (r == -ELOOP) {
                problem(f, false, "subvolume '%s': its directories form a loop", rec->name);
                return 0;
        }
        if (r < 0)
                return r;

        ino_taken = c.next_ino <= highest;
        counts_wrong = c.inodes != inodes || c.logical_bytes != logical;
        if (!ino_taken && !counts_wrong)
                return 0;
        if (f->repair) {
                mended = c;
                if (ino_taken)
                        mended.next_ino = highest + 1;
                mended.inodes = inodes;
                mended.logical_bytes = logical;
                fixed = layer_write_counters(top, &mended) >= 0;
        }
        if (ino_taken)
                problem(f, fixed, "subvolume '%s': the next inode number, %" PRIu64 ", is taken (its inodes go up to "
                        "%" PRIu64 "): a new file would take the place of an existing one", rec->name, c.next_ino, highest);
        if (counts_wrong)
                problem(f, fixed, "subvolume '%s': its counters say %" PRIu64 " inodes and %" PRIu64 " bytes, its layers "
                        "hold %" PRIu64 " and %" PRIu64, rec->name, c.inodes, c.logical_bytes, inodes, logical);
        return 0;
}

/* Every visible entry of the subvolume names an inode that exists. */
static int check_subvolume(Fsck *f, const SubvolumeRecord *rec, uint64_t bytes) {
        _cleanup_(stack_done) Stack st = {};
        _cleanup_(fsck_step_end) FsckStep step = {};
        StackLayers layers;
        int r, unrepaired = f->unrepaired;

        r = stack_open(f->store, rec, &st);
        if (r == -EUCLEAN) {
                problem(f, false, "subvolume '%s': its layer stack is broken", rec->name);
                return 0;
        }
        if (r < 0)
                return r;
        /* The census of the counters' check, then the walk. */
        fsck_step_begin(&step, f, st.dbs, st.n, bytes, 2);
        r = stack_layers(&st, &layers);
        if (r < 0)
                return r;
        for (size_t i = 0; i < f->n_clean; i++)
                if (stack_layers_equal(&f->clean[i], &layers)) {
                        free(layers.ids);
                        return 0;
                }

        r = check_counters(f, rec, &st);
        if (r >= 0)
                r = stack_read_begin(&st);
        if (r < 0) {
                free(layers.ids);
                return r;
        }

        for (size_t i = 0; r >= 0 && i < st.n; i++) {
                _cleanup_stmt_ sqlite3_stmt *q = NULL;

                if (!st.dbs[i])
                        continue;
                r = sqlite_prepare(st.dbs[i], "SELECT parent, name, ino FROM dentries WHERE ino != 0", &q);
                while (r >= 0 && (r = sqlite_step_row(q)) > 0) {
                        uint64_t ino = (uint64_t) sqlite3_column_int64(q, 2), visible;

                        r = stack_dentry(&st, (uint64_t) sqlite3_column_int64(q, 0), sqlite3_column_blob(q, 1),
                                         sqlite3_column_bytes(q, 1), &visible);
                        if (r < 0 || visible != ino)
                                continue;
                        /* In any layer: as if hidden from below the bottom. */
                        r = stack_row_hidden(&st, st.n, ino);
                        if (r == 0)
                                problem(f, false, "subvolume '%s': entry '%.*s' names inode %" PRIu64 ", which is missing",
                                        rec->name, sqlite3_column_bytes(q, 1),
                                        (const char *) sqlite3_column_blob(q, 1), ino);
                }
        }
        stack_read_end(&st);
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
                if (r < 0)
                        return r;
        }
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
        r = catalog_list_subvolumes(s, &recs, &n);
        if (r < 0)
                return r;
        r = fsck_all(&f, recs, n);
        subvolume_records_free(recs, n);
        return r < 0 ? r : f.unrepaired;
}
