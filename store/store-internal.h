/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Internals shared by the files of store/. Nothing outside store/ includes
 * this header.
 *
 * On disk, a store is:
 *   catalog.db        SQLite (WAL): store identity and secret, layers (a tree
 *                     by parent), subvolumes (each names its top layer), the
 *                     block index (digest -> pack, offset) and counters
 *   layers/N.db       one SQLite database per layer: inodes, directory
 *                     entries (with whiteouts), xattrs, extents, and the
 *                     set of blocks the layer references
 *   packs/N.pack      append-only files of block records (pack.h format)
 *   locks/            one lock file per subvolume (held by its server),
 *                     reaper.lock, gc.lock and gc-intent.lock
 *   log, log.old      what servers and reapers on their own had to say
 */

#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <zstd.h>

#include "cleanup.h"
#include "mutex-util.h"
#include "store.h"
#include "string-util.h"

/* 2: the catalog's records carry checks, which its triggers compute
 * through a function that programs of format 1 lack. */
#define STORE_FORMAT_VERSION 2
#define STORE_SECRET_SIZE 192

/* Files are cut into blocks of this size at aligned offsets. */
#define STORE_BLOCK_SIZE (64 * 1024)
/* Regular files up to this size live inline in their inode row. */
#define INLINE_MAX 4096
/* The zstd level of blocks, and of everything compressed with the store's
 * dictionary. */
#define STORE_ZSTD_LEVEL 3

/* A block's address: XXH3-128 of its content, keyed with the store's secret. */
typedef struct Digest {
        uint8_t bytes[16];
} Digest;

void digest_to_hex(const Digest *d, char ret[static 33]);

#define STORE_LOG_FILE "log"

/* The checksum of an inline content or symlink target as stored. */
uint64_t inline_check(const void *stored, size_t len);

typedef struct SpaceGuard {
        pthread_mutex_t lock;
        uint64_t free_bytes;    /* of the host file system, at the last look */
        uint64_t total_bytes;
        uint64_t checked_usec;
        uint64_t held_bytes;    /* accepted by this process, not yet stored */
        uint64_t probed_usec;   /* when cleaning up last asked the file system */
        bool probe_fits;        /* and whether the floor fitted then */
} SpaceGuard;

typedef struct StoreClaim StoreClaim;

struct Store {
        char *path;
        int dir_fd;
        int packs_fd;
        int layers_fd;
        int locks_fd;

        /* One connection to the catalog, serialized by catalog_lock. */
        pthread_mutex_t catalog_lock;
        sqlite3 *catalog;
        /* The block index lookup of every cold read, prepared once. */
        sqlite3_stmt *find_block;

        uint8_t secret[STORE_SECRET_SIZE];
        char uuid[37];

        struct Packs *packs;
        struct Dictionaries *dicts;
        SpaceGuard space;

        /* The claims this process holds (claim.c). */
        pthread_mutex_t claims_lock;
        StoreClaim *claims;

        /* In the list of this process's open stores. */
        Store *open_prev, *open_next;
};

DEFINE_TRIVIAL_CLEANUP_FUNC(Store *, store_close);
DEFINE_TRIVIAL_CLEANUP_FUNC(ZSTD_DCtx *, ZSTD_freeDCtx);

/* The catalog connection is shared by threads. The lock, recursive, keeps
 * a transaction or a statement's steps whole; SQLite's own mutex (the
 * connection is opened SQLITE_OPEN_FULLMUTEX) keeps the connection whole
 * when a statement is finalized by its cleanup handler after the guard
 * of the lock went out of scope, as it is wherever the statement was
 * declared first. */
#define CATALOG_LOCKED(s) MUTEX_LOCKED(&(s)->catalog_lock)

#define FOREACH_STORE_SUBDIR(sub) FOREACH_STRING(sub, "packs", "layers", "locks")

/* ---- claim.c ---- */
/* Closes the descriptors of this process's claims, leaving their files. */
void store_claims_close(Store *s);

/* ---- store.c ---- */
uint64_t now_usec(void);
uint64_t now_nsec(void);
bool uuid_string_is_valid(const char *s);
int read_pid_file(int dir_fd, const char *name, pid_t *ret);
int write_pid_file(int fd, const char *suffix);

/* ---- catalog.c ---- */
typedef struct SubvolumeRecord {
        uint64_t id;
        char *name;
        char uuid[37];
        char parent_uuid[37];
        bool readonly;
        uint64_t created_usec;
        uint64_t top_layer;
        uint64_t quota_bytes;   /* 0: no limit */
        char received_uuid[37];
        uint64_t ctransid;
        uint64_t stransid;
        bool damaged;           /* fails its check: only id and name are set */
} SubvolumeRecord;

void subvolume_record_clear(SubvolumeRecord *r);

int catalog_create_schema(sqlite3 *db);
/* Adds what a store made by an older build lacks. */
int catalog_upgrade(Store *s);
/* Marks layer id's database as made (layer_create() does, once it is
 * there); whether it was: 1, 0 (or no such layer), or a negative errno. */
int catalog_layer_set_made(Store *s, uint64_t id);
int catalog_layer_was_made(Store *s, uint64_t id);
/* The store's transaction counter, for the ctransid of subvolumes. */
int catalog_next_transid(Store *s, uint64_t *ret);
int catalog_find_subvolume(Store *s, const char *name, SubvolumeRecord *ret);
int catalog_find_subvolume_by_id(Store *s, uint64_t id, SubvolumeRecord *ret);
/* By received UUID (the newest such) or by own UUID. */
int catalog_find_subvolume_by_uuid(Store *s, const char *uuid, bool received, SubvolumeRecord *ret);
/* -ESTALE as catalog_snapshot(). */
int catalog_set_readonly(Store *s, const SubvolumeRecord *rec, bool readonly);

/* Adds a layer above parent (0: a bottom layer) in the caller's transaction,
 * if any; the catalog lock is the caller's. */
int catalog_new_layer(Store *s, uint64_t parent, uint64_t *ret);

/* The catalog's settings and marks (the meta table), as integers; a key
 * that is not there reads 0. */
int catalog_meta_get_int(Store *s, const char *key, int64_t *ret);
int catalog_meta_set_int(Store *s, const char *key, int64_t value);

/* A fold's merged layer: its row, marked as the one being built by this
 * process, in one transaction. The mark goes in the transaction that swaps
 * the layer in (catalog_fold_done()). catalog_folding_layer() reads the
 * mark: the layer and the pid of its builder, 0 and 0 for none. */
int catalog_new_folding_layer(Store *s, uint64_t parent, uint64_t *ret);
int catalog_fold_done(Store *s);
int catalog_folding_layer(Store *s, uint64_t *ret_id, pid_t *ret_pid);

/* The stack of a layer: ids from the layer itself (index 0) down to the
 * bottom. */
int catalog_layer_stack(Store *s, uint64_t top, uint64_t **ret_ids, size_t *ret_n);
/* The stack of a subvolume's top layer, read with its row in one statement,
 * so that a fold that commits meanwhile cannot tear the two apart. -ENOENT
 * if there is no such subvolume. */
int catalog_subvolume_stack(Store *s, uint64_t id, uint64_t **ret_ids, size_t *ret_n);
/* 1 and the first layer of the stack from top whose record is damaged, or
 * 0 if none is. */
int catalog_stack_damaged_layer(Store *s, uint64_t top, uint64_t *ret_layer);

/* Creates the snapshot, with the UUID given, in the catalog. The source's
 * top layer must be sealed already if the source is writable. -ESTALE if
 * the source's top layer is no longer the record's (a fold merged it
 * away): read it again. -EEXIST if a subvolume has the UUID. */
int catalog_snapshot(Store *s, const SubvolumeRecord *source, const char *name, bool readonly, const char *uuid);

/* Takes a subvolume's lock: exclusive for writers (and for the operations
 * that need it unmounted), shared for read-only servers. -EBUSY with the
 * holder's pid if it is taken. Returns the lock fd. */
int subvolume_lock(Store *s, uint64_t id, bool exclusive, pid_t *ret_holder);

typedef enum SubvolumeLockFlags {
        /* Held for a moment only (a fold, a snapshot): others wait for it
         * rather than fail with -EBUSY. */
        SUBVOLUME_LOCK_BRIEF = 1 << 0,
        /* For a volume: a holder that is alive is given a moment too, for
         * a server whose mount is gone may not have noticed it yet. */
        SUBVOLUME_LOCK_PATIENT = 1 << 1,
        /* Shared for a moment by one that serves nothing: the lock file
         * goes on naming the servers. */
        SUBVOLUME_LOCK_UNNAMED = 1 << 2,
} SubvolumeLockFlags;

int subvolume_lock_full(Store *s, uint64_t id, bool exclusive, SubvolumeLockFlags flags, pid_t *ret_holder);

/* 1 and the holder's pid if a process has the subvolume mounted, or holds
 * it for a moment. */
int subvolume_lock_holder(Store *s, uint64_t id, pid_t *ret_holder);
int subvolume_locks_prune(Store *s);
int catalog_id_known(Store *s, const char *table, uint64_t id);

/* Layers that no live subvolume reaches, and those that one does. */
int catalog_live_layers(Store *s, uint64_t **ret_ids, size_t *ret_n);
int catalog_dead_layers(Store *s, uint64_t **ret_ids, size_t *ret_n);

/* How many live subvolumes' stacks include each layer a live subvolume
 * reaches, sorted by layer: one query walks every stack, so all layers
 * come at once. */
typedef struct LayerUsers {
        uint64_t layer;
        int64_t users;
} LayerUsers;
int catalog_all_layer_users(Store *s, LayerUsers **ret, size_t *ret_n);
/* Whether more than one live subvolume's stack includes the layer: for
 * one stack, without walking every other. */
int catalog_layer_is_shared(Store *s, uint64_t layer);
/* The live subvolumes by name. A damaged record is listed with its id and
 * name alone and damaged set, or is left out if skip_damaged (scrub and
 * fsck, which name it through catalog_damaged_records()). */
int catalog_list_subvolumes(Store *s, bool skip_damaged, SubvolumeRecord **ret, size_t *ret_n);

/* The records of the catalog whose check fails, and how many records
 * there are in all. live_only: only those of subvolumes, and of layers
 * that live subvolumes stand on (a dead one is dropped as it is). */
typedef enum CatalogRecordKind {
        CATALOG_RECORD_SUBVOLUME,
        CATALOG_RECORD_LAYER,
        CATALOG_RECORD_META,            /* a setting or the store's identity, by key */
        CATALOG_RECORD_COUNTER,         /* by key */
        CATALOG_RECORD_PACK,
} CatalogRecordKind;

typedef struct CatalogDamage {
        CatalogRecordKind kind;
        uint64_t id;            /* of a subvolume, layer or pack */
        char *name;             /* a subvolume's name as recorded (perhaps damaged), or a key */
} CatalogDamage;

int catalog_damaged_records(Store *s, bool live_only, CatalogDamage **ret, size_t *ret_n, uint64_t *ret_checked);
/* Writes a damaged record of a setting, a counter or a pack anew, from
 * what can still be known; -EUCLEAN for those that cannot be (the store's
 * identity; a subvolume's or a layer's: deleting the subvolume mends it). */
int catalog_mend_record(Store *s, const CatalogDamage *d);
/* -EUCLEAN if the record of the store's format, UUID or secret is damaged. */
int catalog_check_identity(Store *s);
/* The id of a subvolume of this name whose record is damaged, and the
 * removal of that record: a delete of it. Deleted or not: that flag of a
 * damaged record is not to be believed either. -ENOENT if there is none. */
int catalog_damaged_subvolume_id(Store *s, const char *name, uint64_t *ret_id);
/* 1 if the record of this id is damaged, deleted or not; 0 otherwise. */
int catalog_subvolume_is_damaged(Store *s, uint64_t id);
int catalog_remove_damaged_subvolume(Store *s, uint64_t id);
void catalog_damage_array_free(CatalogDamage *d, size_t n);
int catalog_subvolume_names(Store *s, char ***ret);
int catalog_block_totals(Store *s, uint64_t *ret_blocks, uint64_t *ret_bytes);
int catalog_metadata_bytes(Store *s, uint64_t *ret_bytes, uint64_t *ret_layers);

/* The blocks of the index in one pack (every pack if 0), sorted by pack
 * and offset. */
struct BlockRow;
int catalog_list_blocks(Store *s, uint64_t pack, struct BlockRow **ret, size_t *ret_n);
/* 1 if the index has a block in the pack, 0 if not. */
int catalog_pack_has_blocks(Store *s, uint64_t pack);

/* ---- layer.c ---- */
typedef struct LayerCounters {
        uint64_t next_ino;
        uint64_t logical_bytes;
        uint64_t inodes;
        uint64_t stored_bytes;  /* distinct blocks this layer references */
} LayerCounters;

int layer_path(Store *s, uint64_t id, char **ret);
int layer_create(Store *s, uint64_t id, const LayerCounters *inherit, bool with_root, sqlite3 **ret);
typedef enum LayerOpenMode {
        LAYER_READ,             /* read-only; a writer may still commit to it */
        LAYER_READ_FROZEN,      /* read-only and immutable: sealed, no locking */
        LAYER_WRITE,            /* the writer of the top layer */
} LayerOpenMode;

/* -ENOENT if the layer has no database (it is empty). */
int layer_open(Store *s, uint64_t id, LayerOpenMode mode, sqlite3 **ret);
int layer_exists(Store *s, uint64_t id);
/* Makes the layer's file complete, so that once frozen it can be opened
 * immutable by anyone: a WAL left with frames (by a crash, or kept by a
 * connection still open) is checkpointed and the layer switched to a
 * rollback journal; without one there is nothing to do. */
int layer_seal(Store *s, uint64_t id);
/* Leaves WAL mode for a rollback journal, waiting for other connections
 * (readers of the space estimate among them) to let go for a while; -EBUSY
 * if they never do. */
int layer_journal_delete(sqlite3 *db);
int layer_read_counters(sqlite3 *db, LayerCounters *ret);
int layer_write_counters(sqlite3 *db, const LayerCounters *c);
/* The highest inode number that has a row in the layer, 0 for none. */
int layer_highest_ino(sqlite3 *db, uint64_t *ret);
int layer_unlink(Store *s, uint64_t id);
uint64_t layer_file_bytes(Store *s, uint64_t id);
/* What dropping a dead layer gives back, as the space estimate counts it:
 * its file and the stored bytes of the blocks it references. */
uint64_t layer_reclaimable_bytes(Store *s, uint64_t id);

/* Row checks. Every row of a layer's tables carries row_check, the
 * cowbox_check() of its other columns (an inline content is covered through
 * data_check), so that a row changed behind SQLite's back is caught: SQLite
 * checksums none of its pages. Statements that write a row compute it with
 * the row; statements that read one return "row_check IS <check>" as a
 * column, which is 0 for a damaged row. Layers written before row checks
 * existed lack the column: their rows read as intact, and such a layer is
 * given checks when it is opened for writing. */
#define INODE_CHECK_WITH(lower_limit)                                                                   \
        "cowbox_check('inode', ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, ctime_ns, parent, " \
        lower_limit ", data_zstd, data_check)"
#define INODE_CHECK INODE_CHECK_WITH("lower_limit")
#define DENTRY_CHECK "cowbox_check('dentry', parent, name, ino, type)"
#define XATTR_CHECK "cowbox_check('xattr', ino, name, value)"
#define EXTENT_CHECK "cowbox_check('extent', ino, idx, digest, len)"
#define BLOCKREF_CHECK "cowbox_check('blockref', digest, refs, stored_len)"
#define INFO_CHECK "cowbox_check('info', key, value)"

/* The catalog's rows of subvolumes and layers carry checks too: a damaged
 * top_layer or parent would give a subvolume another's files, and the
 * reaper would free the blocks of the layers it lost. Triggers compute
 * them (catalog.c), so that none of the statements that change a column
 * can forget to. */
#define SUBVOLUME_CHECK_OF(row)                                                                          \
        "cowbox_check('subvolume', " row "id, " row "name, " row "uuid, " row "parent_uuid, " row "readonly, " \
        row "created_usec, " row "top_layer, " row "quota_bytes, " row "deleted, " row "received_uuid, "       \
        row "ctransid, " row "stransid)"
#define SUBVOLUME_CHECK SUBVOLUME_CHECK_OF("")
#define LAYER_CHECK_OF(row) \
        "cowbox_check('layer', " row "id, " row "parent, " row "created_usec, " row "made)"
/* And the rest of the catalog's own rows: the store's identity and
 * settings, its counters, its pack files. */
#define META_CHECK_OF(row) "cowbox_check('meta', " row "key, " row "value)"
#define COUNTER_CHECK_OF(row) "cowbox_check('counter', " row "key, " row "value)"
#define PACK_CHECK_OF(row) "cowbox_check('pack', " row "id, " row "created_usec)"

/* Registers cowbox_check() on a connection: every connection that reads
 * or writes checked rows needs it. */
int row_check_register(sqlite3 *db);

/* Rebuilds a layer's block set from its extents, with each block's stored
 * length from the temporary table lens, which it drops. schema is "" or
 * "main."; check_column and check are ", row_check" and ", "
 * BLOCKREF_CHECK, or empty for a layer without row checks. */
#define BLOCKREFS_FROM_EXTENTS(schema, check_column, check)                                              \
        "DELETE FROM " schema "blockrefs;"                                                                \
        "INSERT INTO " schema "blockrefs(digest, refs, stored_len" check_column ")"                       \
        "  SELECT digest, refs, stored_len" check " FROM (SELECT e.digest AS digest, count(*) AS refs,"    \
        "    coalesce((SELECT stored_len FROM lens WHERE lens.digest = e.digest), 0) AS stored_len"       \
        "    FROM " schema "extents e WHERE e.digest IS NOT NULL GROUP BY e.digest);"                      \
        "DROP TABLE lens;"

/* Whether the layer attached as schema ("main", ...) has row checks. */
bool layer_has_row_checks(sqlite3 *db, const char *schema);
/* The number of rows of the layer whose check fails, in all its tables. */
int layer_count_damaged_rows(sqlite3 *db, const char *schema, int64_t *ret);

/* ---- dictionary.c ---- */
int dictionaries_new(Store *s, struct Dictionaries **ret);
struct Dictionaries *dictionaries_free(struct Dictionaries *d);
/* The store's dictionary, NULL until it has one. */
const ZSTD_CDict *dictionary_for_compression(Store *s);
/* Offers the content of a small file to train the dictionary on, until the
 * store has one. */
void dictionary_offer_sample(Store *s, const void *data, size_t len);
/* Compresses with the store's dictionary if it has one, else at level. */
size_t zstd_compress_small(Store *s, ZSTD_CCtx *cctx, void *dst, size_t cap, const void *src, size_t len,
                           int level);
/* Decompresses one frame, with the dictionary it names if it names one.
 * -EIO if it is damaged or names a dictionary the store lacks. */
int zstd_decompress(Store *s, ZSTD_DCtx *dctx, void *dst, size_t cap, const void *src, size_t len, size_t *ret);

/* ---- blocks.c ---- */
typedef struct BlockLocation {
        uint64_t pack;
        uint64_t offset;
        uint32_t stored_len;
        uint32_t raw_len;
} BlockLocation;

/* A block of the index: its digest and where it is stored. */
typedef struct BlockRow {
        Digest digest;
        BlockLocation loc;
} BlockRow;

int packs_new(Store *s, struct Packs **ret);
struct Packs *packs_free(struct Packs *p);

void block_digest(Store *s, const void *data, size_t len, Digest *ret);

/* Looks a block up in the index (and in this process's blocks not yet
 * indexed). 0 and ret filled if present, -ENOENT if not. */
int block_lookup(Store *s, const Digest *d, BlockLocation *ret);
/* As block_lookup(), remembering where blocks lie: for reads only, which
 * verify what they find there (see blocks.c). */
int block_locate(Store *s, const Digest *d, BlockLocation *ret);
void block_forget_location(Store *s, const Digest *d);

/* Stores a block unless it is there already; returns its location. The
 * index rows become visible to others at block_commit(). */
int block_put(Store *s, const void *data, size_t len, const Digest *d, BlockLocation *ret);

/* One block of block_put_many(): data, len and digest in; loc and result
 * (0, or a negative errno) out. */
typedef struct BlockPut {
        const void *data;
        size_t len;
        Digest digest;
        BlockLocation loc;
        int result;
        uint8_t *record;        /* internal */
        size_t record_len;
} BlockPut;

/* block_put() of many blocks; those new to the store are compressed by
 * several threads at once. */
void block_put_many(Store *s, BlockPut *puts, size_t n);

/* Reads and verifies a block into buf (STORE_BLOCK_SIZE bytes, zero past the
 * block's length); returns its length. -EIO on any mismatch, which is counted. */
int block_read(Store *s, const Digest *d, void *buf);
int block_read_at(Store *s, const Digest *d, const BlockLocation *loc, void *buf);

/* Makes appended blocks durable and indexes them. Once a sync of this
 * process's pack failed, fails for good: the blocks appended since may be
 * lost, and changes that reference them must go (block_writer_failed()). */
int block_commit(Store *s);
bool block_writer_failed(Store *s);

/* Counts a corruption event in the catalog, where usage reports it. */
void block_count_corruption(Store *s);
/* Remembers that the record of block d is damaged: the next write of the
 * same bytes stores them anew, and heals every file that uses it. */
void block_mark_damaged(Store *s, const Digest *d);

/* As block_read_at(), but names what is wrong and counts nothing: for scrub. */
int block_read_at_reason(Store *s, const Digest *d, const BlockLocation *loc, void *buf, const char **ret_reason);

/* The stored zstd frame of a block, verified (-ENODATA if the block is
 * stored uncompressed). buf holds STORE_BLOCK_SIZE bytes. */
int block_read_stored_zstd(Store *s, const Digest *d, void *buf, size_t *ret_len);

/* Punches the records of unindexed blocks of one pack, sorted by offset,
 * out of it. */
int pack_punch(Store *s, uint64_t pack, const BlockRow *rows, size_t n);
/* 1 if a writer still appends to the pack (it holds its lock), else 0. */
int pack_is_written(Store *s, uint64_t pack);

uint64_t packs_disk_bytes(Store *s);

/* Opens a pack for reading (cached). */
int pack_fd(Store *s, uint64_t pack);

/* Record format in packs. */
#define PACK_RECORD_MAGIC 0x42584243u /* "CBXB" little-endian */
#define PACK_COMPRESSION_NONE 0
#define PACK_COMPRESSION_ZSTD 1

typedef struct __attribute__((packed)) PackRecordHeader {
        uint32_t magic;
        uint8_t version;
        uint8_t compression;
        uint16_t reserved;
        uint32_t raw_len;
        uint32_t stored_len;
        uint8_t digest[16];
        uint64_t payload_check;  /* XXH3-64 of the stored payload */
        uint32_t header_check;   /* XXH32 of the bytes above */
        uint32_t padding;
} PackRecordHeader;

/* Verifies a record read at its location; decompresses into buf. */
int pack_record_decode(Store *s, ZSTD_DCtx *dctx, const void *record, size_t record_len, const Digest *expect,
                       void *buf, const char **ret_reason);

/* ---- space.c ---- */
typedef enum SpaceUse {
        SPACE_DATA,             /* file contents: must leave the whole margin */
        SPACE_METADATA,         /* new names, xattrs: may use half of it */
        SPACE_CLEANUP,          /* unlink, truncate, delete: allowed down to a floor */
} SpaceUse;

/* -ENOSPC if bytes more would eat into the margin kept for use. */
int space_check(Store *s, uint64_t bytes, SpaceUse use);
void space_hold(Store *s, uint64_t bytes);
void space_release(Store *s, uint64_t bytes);
/* Bytes written to the disk since the last look at its free space: held
 * bytes that are stored leave the hold, and must not go uncounted until
 * the next look. */
void space_used(Store *s, uint64_t bytes);
/* Whether free space is near the margin: writers keep little in memory. */
bool space_low(Store *s);
uint64_t space_margin(Store *s);
/* The margin of a file system of this size. */
uint64_t space_margin_of(uint64_t total_bytes);
/* The size of the reserve file on a file system of this size. */
uint64_t space_reserve_of(uint64_t total_bytes);
/* Looks at the free space now, and gives back or makes the reserve file as
 * it requires. */
void space_update(Store *s);
/* The bytes the reserve file holds now, 0 if it is given back. */
uint64_t space_reserve_held(int dir_fd);

/* ---- the pace of a reaper (reaper.c) ---- */
typedef struct Pace Pace;
/* Called after freeing bytes: counts them as progress, and sleeps as the
 * rate asks. -EAGAIN if the reaper is paused. */
int pace_step(Pace *p, uint64_t bytes);
/* Called after writing bytes (a fold's merged layer): sleeps as the rate
 * asks. Work written is kept, paused or not. */
void pace_wrote(Pace *p, uint64_t bytes);
/* The bytes a reap took out of the catalog's reach and has not freed yet
 * (left by a pause, a crash or a kill): part of what the next reap frees. */
uint64_t reaper_pending_bytes(Store *s);

/* ---- fold.c ---- */
int fold_layers(Store *s, Pace *pace, StoreReapStats *stats);

/* ---- gc locking (reaper.c) ---- */
/* Writers hold the shared GC lock while they have references to blocks that
 * are not committed yet, so that the reaper never frees a block between a
 * writer's dedup hit and its commit. */
/* The lock only one reaper holds at a time, also taken by work that must
 * not see layers and blocks go from under it (fsck, scrub): its fd, or
 * -EBUSY with *ret_holder if another holds it and wait is false. Where it
 * waits, a waiter named logs that it does. */
int reaper_lock(Store *s, bool wait, const char *waiter, pid_t *ret_holder);
int gc_lock_shared(Store *s, int *fd);
int gc_try_lock_shared(Store *s, int *fd);
void gc_unlock(int *fd);

/* ---- control.c ---- */
typedef struct ControlServer ControlServer;
struct Volume;
int control_server_start(struct Volume *v, Store *s, uint64_t subvolume_id, ControlServer **ret);
ControlServer *control_server_stop(ControlServer *c);
/* Asks the server of the subvolume for a snapshot; -ECONNREFUSED if
 * nobody serves its control socket. */
int control_request_snapshot(Store *s, uint64_t subvolume_id, const char *name, bool readonly, const char *uuid);
/* Tells the server of the subvolume, if one has it mounted writable, that
 * its quota changed. */
int control_request_quota(Store *s, uint64_t subvolume_id);

/* ---- volume.c ---- */
/* Snapshots the volume's subvolume on behalf of another process: commits,
 * seals the top layer and moves onto a new one. */
int volume_take_snapshot(struct Volume *v, const char *name, bool readonly, const char *uuid);
/* Reads the subvolume's quota from the catalog again. */
void volume_quota_refresh(struct Volume *v);
