/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Internals shared by volume.c (layers, transactions, rows), volume-data.c
 * (file contents) and volume-ops.c (the name space). */

#include <pthread.h>
#include <sqlite3.h>
#include <zstd.h>

#include "store-internal.h"
#include "store.h"

/* A layer of the volume's stack, with its prepared queries. */
typedef struct VolumeLayer {
        uint64_t id;
        sqlite3 *db;            /* NULL: the layer has no database, it is empty */
        sqlite3_stmt *get_inode;
        sqlite3_stmt *get_dentry;
        sqlite3_stmt *list_dentries;
        sqlite3_stmt *get_extent;
        sqlite3_stmt *list_extents;     /* of an inode, from a block index on */
        sqlite3_stmt *get_xattr;
        sqlite3_stmt *list_xattrs;
        sqlite3_stmt *copy_xattrs;
        /* Of a small layer below the top, which never changes: every inode
         * number that keys one of its rows, sorted. A lookup skips the
         * layer when its key is not there, so that a stack deep in small
         * layers (a live subvolume snapshotted many times) is read about
         * as fast as a shallow one. */
        uint64_t *keys;
        size_t n_keys;
        bool keyed;
} VolumeLayer;

/* Whether the layer may have a row keyed by ino. */
bool layer_may_have(const VolumeLayer *l, uint64_t ino);

/* Statements that change the top layer. */
typedef struct TopStatements {
        sqlite3_stmt *put_inode;
        sqlite3_stmt *put_inode_attrs;
        sqlite3_stmt *delete_inode;
        sqlite3_stmt *put_dentry;
        sqlite3_stmt *delete_dentry;
        sqlite3_stmt *delete_dentries_of;
        sqlite3_stmt *put_extent;
        sqlite3_stmt *list_extents_from;
        sqlite3_stmt *delete_extents_from;
        sqlite3_stmt *put_xattr;
        sqlite3_stmt *delete_xattr;
        sqlite3_stmt *delete_xattrs_of;
        sqlite3_stmt *get_blockref;
        sqlite3_stmt *put_blockref;
        sqlite3_stmt *delete_blockref;
        sqlite3_stmt *list_orphans;
        sqlite3_stmt *savepoint;
        sqlite3_stmt *release_savepoint;
        sqlite3_stmt *rollback_to_savepoint;
} TopStatements;

/* A block of a file being changed in memory; flushed at commit. */
typedef struct DirtyBlock {
        uint64_t ino;
        uint64_t idx;
        uint64_t seq;           /* the volume's dirty_seq at its last change */
        uint64_t changed_usec;  /* monotonic time of its last change */
        struct DirtyBlock *next;
        /* Bytes of data allocated; the block's bytes past them are zeros.
         * A small file's block holds its few KiB, not STORE_BLOCK_SIZE:
         * allocating and zeroing whole blocks took a seventh of the
         * server's time while cp -r wrote small files. */
        size_t capacity;
        uint8_t *data;
} DirtyBlock;

#define DIRTY_BUCKETS 4096
/* Blocks are stored this many at a time: the new ones among them are
 * compressed by several threads. */
#define FLUSH_BATCH 64
/* Past this many dirty blocks (64 MiB), writes flush them before commit. */
#define DIRTY_MAX 1024
/* And past this many (1 MiB) while space is low: what other processes
 * hold in memory cannot be seen, only what they have stored. */
#define DIRTY_LOW_SPACE 16
/* Past this many more dirty blocks (4 MiB) since the last look, the
 * committer stores whole ones ahead of the commit, those left alone for
 * FLUSH_AHEAD_AGE_USEC: a block rewritten more often than that is stored
 * once, at the commit. */
#define FLUSH_AHEAD_BLOCKS 64
#define FLUSH_AHEAD_AGE_USEC 50000
/* Small files are compressed alone: a fast level does as well as any. */
#define INLINE_ZSTD_LEVEL 1

struct Volume {
        Store *store;
        char *name;
        uint64_t subvolume_id;
        bool writable;

        pthread_mutex_t lock;

        VolumeLayer *layers;    /* [0] is the top */
        size_t n_layers;
        TopStatements top;
        bool top_prepared;

        /* Inodes with names and the bytes of the regular files among them:
         * what a snapshot, a later mount and fsck see. */
        LayerCounters counters;
        /* Bytes of regular files unlinked while open, ours until the kernel
         * forgets them: they count against the quota, not in the counters. */
        uint64_t orphan_bytes;
        uint64_t quota_bytes;   /* limit of counters.logical_bytes + orphan_bytes, 0: none */
        bool in_transaction;
        int64_t changes_at_begin; /* sqlite3_total_changes64() when it began */
        bool changed;
        /* SQLite rolled the transaction back (a commit failed, or an I/O
         * error), or a change that failed could not be undone: what the
         * kernel was told no longer matches the layer. Everything fails
         * with EIO until the volume is opened again. */
        bool failed;
        /* Counts changes of dirty blocks: a change of the top layer that
         * made one cannot be rolled back. */
        uint64_t memory_changes;

        DirtyBlock *dirty[DIRTY_BUCKETS];
        size_t n_dirty;
        uint64_t dirty_seq;
        /* Stored ahead of the commit by the committer, without the lock,
         * so that a commit (a snapshot's above all) finds little left to
         * compress. */
        size_t flush_ahead_at;  /* n_dirty that asks for it */
        uint64_t flush_ahead_retry_usec; /* when young blocks left behind are old enough; 0: none */
        bool flush_ahead_wanted;
        bool flushing_ahead;    /* the GC lock stays held until it is done */

        int lock_fd;
        int gc_fd;

        pthread_t committer;
        bool committer_running;
        bool stopping;
        pthread_cond_t wake;
        /* Signalled when orphan_bytes shrinks: a write that only the bytes
         * of files the kernel has not forgotten yet keep over the quota
         * waits for them a moment (see volume_write()). */
        pthread_cond_t orphans_gone;

        ControlServer *control;
        /* Writes back what the kernel holds of this volume (its page cache
         * with the writeback cache), before a snapshot another process
         * asked for. */
        int (*write_back)(void *userdata);
        void *write_back_userdata;
        void (*before_wait)(void);

        /* Compression of small files' inline contents. */
        ZSTD_CCtx *cctx;
        ZSTD_DCtx *dctx;
        uint8_t inline_scratch[ZSTD_COMPRESSBOUND(INLINE_MAX)];
};

/* An inode as the topmost layer that has it says. */
typedef struct InodeRow {
        uint64_t ino;
        mode_t mode;
        uint32_t nlink;
        uid_t uid;
        gid_t gid;
        uint64_t rdev;
        uint64_t size;
        int64_t atime_ns;
        int64_t mtime_ns;
        int64_t ctime_ns;
        uint64_t parent;        /* directories only */
        uint64_t lower_limit;
        uint8_t *data;          /* inline content or symlink target */
        size_t data_len;
        bool has_data;
        /* The content as stored when it was read, and the XXH3-64 of what
         * it decoded to: put back unchanged, it is not compressed again. */
        uint8_t *stored;
        size_t stored_len;
        bool stored_zstd;
        uint64_t stored_check;
        uint64_t decoded_check;
        /* Read by inode_get_attr(): the inline content is in the layer but
         * not in data. inode_put() then changes the attributes only. */
        bool content_unread;
        size_t layer;           /* index in v->layers where it was found */
} InodeRow;

#define LOWER_LIMIT_NONE ((uint64_t) INT64_MAX)

void inode_row_clear(InodeRow *row);
/* 0 if the row a layer query stands on passed its row check (the given
 * column), else -EIO, counted as corruption. */
int volume_row_intact(Volume *v, sqlite3_stmt *st, int column);

/* ---- volume.c ---- */
int volume_ensure_top(Volume *v);

/* A change of the top layer is all or nothing: it runs in a savepoint of
 * the open transaction. When it fails, the savepoint is rolled back and the
 * counters it moved go back with it. */
typedef struct TopChange {
        LayerCounters counters;
        uint64_t orphan_bytes;
        uint64_t memory_changes;
        bool changed;
        bool begun;
} TopChange;

int top_change_begin(Volume *v, TopChange *ret);
/* Ends the change with the result r of its work: released if r >= 0, else
 * undone. Returns r, or the error that kept the change from being kept. */
int top_change_end(Volume *v, const TopChange *c, int r);
int inode_get(Volume *v, uint64_t ino, InodeRow *ret);
/* The row without a regular file's inline content (data is NULL, data_len
 * its size): what stat needs, without decompressing anything. */
int inode_get_attr(Volume *v, uint64_t ino, InodeRow *ret);
/* inode_get_for_write() for changes of attributes only: the content is
 * read only where the row has to be copied up. */
int inode_get_attr_for_write(Volume *v, uint64_t ino, InodeRow *ret);
int inode_put(Volume *v, const InodeRow *row);
/* Returns the row after copying it up into the top layer if needed. */
int inode_get_for_write(Volume *v, uint64_t ino, InodeRow *ret);
int inode_drop(Volume *v, const InodeRow *row);
void inode_unlinked(Volume *v, const InodeRow *row);
void inode_forgotten(Volume *v, const InodeRow *row);
void logical_size_changed(Volume *v, const InodeRow *row, uint64_t old_size, uint64_t new_size);
/* Adds n to a count of bytes, which stops at 2^63 - 1, what the store's
 * counters and a quota hold: sparse files may add up to more (each may be
 * that large), which would wrap it and every figure made of it. Past it,
 * the figure is a floor; fsck counts it anew. */
void bytes_add(uint64_t *bytes, uint64_t n);
void inode_to_stat(Volume *v, const InodeRow *row, struct stat *ret);

int dentry_get(Volume *v, uint64_t parent, const char *name, uint64_t *ret_ino, mode_t *ret_type);
int dentry_put(Volume *v, uint64_t parent, const char *name, uint64_t ino, mode_t type);
int dentry_remove(Volume *v, uint64_t parent, const char *name);
int dentries_list(Volume *v, uint64_t parent, VolumeDirent **ret, size_t *ret_n, bool stop_at_first);

int extent_get(Volume *v, const InodeRow *row, uint64_t idx, Digest *ret_digest, uint32_t *ret_len, bool *ret_hole);
int extent_put(Volume *v, uint64_t ino, uint64_t idx, const Digest *digest, uint32_t len, uint32_t stored_len);
int extents_delete_from(Volume *v, uint64_t ino, uint64_t first_idx);

int volume_commit_locked(Volume *v, uint64_t must_ino);
void volume_mark_changed(Volume *v);
int64_t timestamp_now(void);
/* A time as the volume keeps it, nanoseconds since the epoch in an
 * int64_t: a time outside its years (1677 to 2262) is clamped to them, as
 * ext4 clamps to its own. And back, the nanoseconds never negative. */
int64_t timestamp_from_timespec(const struct timespec *ts);
struct timespec timestamp_to_timespec(int64_t ns);

/* Whether the subvolume's files, with orphans bytes of those unlinked but
 * not forgotten and grown by growth, pass its limit; false if it has none. */
bool quota_passed(const Volume *v, uint64_t orphans, uint64_t growth);
/* -EDQUOT if growing the subvolume by bytes would pass its limit. */
int volume_check_quota(Volume *v, uint64_t bytes);
void volume_commit_if_short(Volume *v);

/* ---- volume-data.c ---- */
int data_truncate(Volume *v, InodeRow *row, uint64_t size);
int data_flush_all(Volume *v, uint64_t must_ino, int *ret_failed);
/* Caller holds the lock, which is let go while blocks are compressed.
 * Returns how many blocks it picked (at most FLUSH_BATCH). */
int data_flush_ahead(Volume *v);
void data_forget_dirty(Volume *v, uint64_t ino, uint64_t first_idx, uint64_t size);
uint64_t data_allocated_bytes(Volume *v, const InodeRow *row);
