/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * store.h: the public face of cowbox's copy-on-write snapshot store.
 *
 * A store is a directory that holds a catalog (SQLite), one metadata
 * database per layer, and pack files of checksummed, compressed,
 * deduplicated data blocks. A subvolume is a stack of layers; snapshots and
 * deletion are O(1) in the size of the tree, and a reaper frees the space of
 * deleted subvolumes in the background.
 *
 * Every function that returns int returns 0 (or a count) on success and a
 * negative errno on failure. Functions never print; callers report.
 * Several processes may open one store at once.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct Store Store;

#define STORE_DEFAULT_PATH "/var/lib/cowbox"
#define STORE_NAME_MAX 255

/* Creates a new, empty store at path (created if missing, must be empty).
 * -EEXIST if a store is already there, -ENOTEMPTY if the directory holds
 * anything else. */
int store_init(const char *path);

/* Opens an existing store. -ENOENT if there is none at path, -EPROTO if
 * its format is newer than this build understands. */
int store_open(const char *path, Store **ret);
Store *store_close(Store *s);

const char *store_path(const Store *s);

/* A subvolume's description, as list and show report it. */
typedef struct StoreSubvolumeInfo {
        uint64_t id;
        char *name;
        char uuid[37];          /* canonical textual UUID */
        char parent_uuid[37];   /* the source of a snapshot, "" for none */
        bool readonly;
        uint64_t created_usec;  /* CLOCK_REALTIME */
        uint64_t top_layer;
        unsigned depth;         /* layers in its stack */

        /* Space, in bytes: logical is what the files hold (the sum of their
         * sizes); referenced is what the layers of its stack store on disk
         * after compression and deduplication; exclusive is what deleting
         * it would free (the layers only it uses). */
        uint64_t logical_bytes;
        uint64_t referenced_bytes;
        uint64_t exclusive_bytes;
        uint64_t inodes;

        /* The limit of logical_bytes, 0 for none: writes past it fail with
         * EDQUOT. */
        uint64_t quota_bytes;

        /* The process that has it mounted writable, 0 if none. */
        pid_t mounted_by;
} StoreSubvolumeInfo;

void store_subvolume_info_clear(StoreSubvolumeInfo *info);
void store_subvolume_info_array_free(StoreSubvolumeInfo *infos, size_t n);

/* Name rules: 1..255 bytes, no '/', not "." or "..", no control characters.
 * -EINVAL otherwise. */
bool store_name_is_valid(const char *name);

/* Creates an empty writable subvolume. -EEXIST if the name is taken. */
int store_subvolume_create(Store *s, const char *name);

/* Snapshots source as name, read-only or writable, in O(1). Works while
 * source is mounted writable: the server that holds it takes the snapshot
 * at a consistent point. -ENOENT if source does not exist, -EEXIST if name
 * is taken. */
int store_subvolume_snapshot(Store *s, const char *source, const char *name, bool readonly);

/* Marks the subvolume deleted in one transaction and returns; the reaper
 * frees its space later. -EBUSY if it is mounted (ret_holder then names
 * the pid). */
int store_subvolume_delete(Store *s, const char *name, pid_t *ret_holder);

/* Sets the limit of the subvolume's logical bytes (0: none). A server that
 * has it mounted applies the new limit within a few seconds. Lowering it
 * below what the subvolume holds loses nothing: only writes that grow it
 * fail, with EDQUOT. */
int store_subvolume_set_quota(Store *s, const char *name, uint64_t bytes);

int store_subvolume_list(Store *s, StoreSubvolumeInfo **ret, size_t *ret_n);
int store_subvolume_show(Store *s, const char *name, StoreSubvolumeInfo *ret);

/* Space of the whole store. */
typedef struct StoreUsage {
        uint64_t logical_bytes;     /* sum over live subvolumes */
        uint64_t stored_bytes;      /* bytes of live blocks in packs, plus layer metadata */
        uint64_t data_bytes;        /* of which data blocks */
        uint64_t metadata_bytes;    /* of which layer and catalog databases */
        uint64_t blocks;            /* live data blocks */
        uint64_t pack_file_bytes;   /* bytes the pack files occupy on disk */
        uint64_t reclaimable_bytes; /* held by deleted subvolumes, freed by the next reap */
        uint64_t subvolumes;
        uint64_t deleted_subvolumes;
        uint64_t layers;
        uint64_t corruption_events; /* checksum mismatches seen by reads and scrubs */
        uint64_t fs_free_bytes;     /* free space of the host file system under the store */
        uint64_t fs_total_bytes;
} StoreUsage;

int store_usage(Store *s, StoreUsage *ret);

/* The reaper: forgets deleted subvolumes, folds layers that have a single
 * child into it, drops layers nothing uses and frees the blocks nothing
 * references. Only one reaper runs at a time: -EBUSY (and ret_holder) if
 * another holds it, unless wait is true. */
typedef struct StoreReapStats {
        uint64_t subvolumes_forgotten;
        uint64_t layers_dropped;
        uint64_t layers_folded;
        uint64_t blocks_freed;
        uint64_t bytes_freed;
} StoreReapStats;

int store_reap(Store *s, bool wait, StoreReapStats *ret, pid_t *ret_holder);
/* -EAGAIN: the reaper is paused; what was freed before is in *ret. */

/* Settings every reaper of the store follows, kept in the catalog. Paused,
 * reapers stop at their next step and new ones do not start (-EAGAIN);
 * deleted subvolumes wait. The rate bounds the bytes a reaper frees per
 * second (0: no bound), so that it never floods the disk that serves the
 * foreground. */
typedef struct StoreReaperSettings {
        bool paused;
        uint64_t rate_bytes_per_sec;
} StoreReaperSettings;

int store_reaper_settings(Store *s, StoreReaperSettings *ret);
int store_reaper_set_paused(Store *s, bool paused);
int store_reaper_set_rate(Store *s, uint64_t bytes_per_sec);

/* Starts a detached reaper process for this store and returns at once. */
int store_reap_in_background(Store *s);

/* Verifies every live block against its checksum. The callback is called
 * once per damaged block with the subvolumes and paths that use it. */
typedef struct StoreDamage {
        uint64_t pack;
        uint64_t offset;
        char digest[33];        /* hex */
        const char *reason;     /* "checksum mismatch", "truncated record", ... */
        const char *subvolume;  /* one call per (subvolume, path) that uses the block */
        const char *path;       /* NULL if no file uses it any more */
} StoreDamage;

typedef void (*store_damage_cb)(const StoreDamage *d, void *userdata);

typedef struct StoreScrubStats {
        uint64_t blocks_checked;
        uint64_t bytes_checked;
        uint64_t blocks_damaged;
        uint64_t files_damaged;
} StoreScrubStats;

int store_scrub(Store *s, store_damage_cb cb, void *userdata, StoreScrubStats *ret);

/* Checks the catalog, every layer's metadata and the block index for
 * consistency. The callback is called once per problem found; problems
 * that fsck can repair without losing data (orphan inodes, stale locks,
 * counters) are repaired when repair is true. Returns the number of
 * problems left unrepaired. */
typedef void (*store_problem_cb)(const char *what, void *userdata);

int store_fsck(Store *s, bool repair, store_problem_cb cb, void *userdata);

/* Mounts a subvolume through FUSE at mountpoint and serves it until it is
 * unmounted (fusermount3 -u) or the process gets SIGTERM/SIGINT. A
 * writable subvolume can be mounted writable once: -EBUSY (ret_holder set)
 * if another process has it. With background, the process daemonizes once
 * the mount is ready and the call returns 0 in the parent. */
typedef struct StoreMountOptions {
        bool readonly;          /* mount a writable subvolume read-only */
        bool background;
        bool debug;             /* libfuse debug output */
        unsigned max_threads;   /* 0: default */
        int ready_fd;           /* if >= 0: written "1\n" and closed once mounted */
} StoreMountOptions;

int store_mount(Store *s, const char *name, const char *mountpoint,
                const StoreMountOptions *opts, pid_t *ret_holder);

/* Returns a human description of a store error code where a bare strerror()
 * would mislead (e.g. -EPROTO: "store format is newer than this program"). */
const char *store_strerror(int error);
