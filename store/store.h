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
#include <sys/stat.h>
#include <sys/statvfs.h>
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

/* Closes every store the process had open when it forked, in the child.
 * SQLite's state does not survive fork(): a child that opens the store
 * again while the parent's connections are still in its memory shares
 * their lock state without holding their locks, and its commits can be
 * lost when the parent closes. Call it first thing in the child, before
 * any descriptor is closed, while the parent still runs. */
void store_close_inherited(void);

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
         * after compression and deduplication; exclusive is what the
         * layers only it uses store, what deleting it frees at most (less
         * where another subvolume's layers hold the same blocks). */
        uint64_t logical_bytes;
        uint64_t referenced_bytes;
        uint64_t exclusive_bytes;
        uint64_t inodes;

        /* The limit of logical_bytes, 0 for none: writes past it fail with
         * EDQUOT. */
        uint64_t quota_bytes;

        /* The process that has it mounted writable, 0 if none. */
        pid_t mounted_by;

        /* What send streams know it by. ctransid is the store's transaction
         * id of its last change of state (creation, freezing); an image
         * received from a stream also has the sender's UUID and transaction
         * id ("" and 0 otherwise). */
        char received_uuid[37];
        uint64_t ctransid;
        uint64_t stransid;

        /* Only in listings: the catalog's record of the subvolume, or of a
         * layer of its stack, fails its check. Its space is not known, and
         * where its own record is damaged, only its id and name (as the
         * record has it) are; it cannot be shown, mounted or snapshotted.
         * Deleting it mends the store; 'scrub' names the damage. */
        bool damaged;
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

/* The same, the snapshot to have the UUID given (from store_uuid_new()):
 * a caller can write the UUID down before the snapshot exists, and later
 * tell the subvolume it made from another that took the name since.
 * -EEXIST if the name or the UUID is taken, -EINVAL if the UUID is not
 * one. */
int store_subvolume_snapshot_as(Store *s, const char *source, const char *name, bool readonly, const char *uuid);

/* A new random UUID, as the store gives subvolumes, in canonical text. */
int store_uuid_new(char ret[static 37]);

/* Marks the subvolume deleted in one transaction and returns; the reaper
 * frees its space later. -EBUSY if it is mounted (ret_holder then names
 * the pid). */
int store_subvolume_delete(Store *s, const char *name, pid_t *ret_holder);
/* The same by ID: the way to a damaged record whose name is no longer a
 * valid one. */
int store_subvolume_delete_id(Store *s, uint64_t id, pid_t *ret_holder);

/* Sets the limit of the subvolume's logical bytes (0: none). A server that
 * has it mounted applies the new limit within a few seconds. Lowering it
 * below what the subvolume holds loses nothing: only writes that grow it
 * fail, with EDQUOT. */
int store_subvolume_set_quota(Store *s, const char *name, uint64_t bytes);

/* Everything known about each live subvolume, its space included: reads
 * the layers of every one. A subvolume whose record, or a record of whose
 * stack, is damaged is listed all the same, marked damaged. */
int store_subvolume_list(Store *s, StoreSubvolumeInfo **ret, size_t *ret_n);
int store_subvolume_show(Store *s, const char *name, StoreSubvolumeInfo *ret);
/* Only the names of the live subvolumes, sorted: a NULL-terminated array. */
int store_subvolume_names(Store *s, char ***ret);
/* 1 if a live subvolume has this name, 0 if none has, -EUCLEAN if its
 * record is damaged; reads the catalog alone. */
int store_subvolume_exists(Store *s, const char *name);

/* Makes a subvolume read-only (its top layer is frozen) or writable again.
 * -EBUSY if it is mounted. */
int store_subvolume_set_readonly(Store *s, const char *name, bool readonly);

/* -EEXIST if new_name is taken. Works while it is mounted. */
int store_subvolume_rename(Store *s, const char *name, const char *new_name);

/* Renames several at once, all or none: a crash leaves all their old names
 * or all their new ones. On failure, *ret_failed (if given) is the index
 * of the rename that failed, or n if none in particular did. */
typedef struct StoreRename {
        const char *name;
        const char *new_name;
} StoreRename;
int store_subvolumes_rename(Store *s, const StoreRename *renames, size_t n, size_t *ret_failed);

/* Records the UUID and transaction id a send stream gave the subvolume. */
int store_subvolume_set_received(Store *s, const char *name, const char *received_uuid, uint64_t stransid);

/* Finds a live subvolume by UUID: first the newest one received with that
 * UUID, then the one that has it as its own. -ENOENT if none. */
int store_subvolume_find_uuid(Store *s, const char *uuid, StoreSubvolumeInfo *ret);

/* The host's free space under the store, and what the next reap gives
 * back: cheap enough to ask every few seconds, whatever the number of
 * subvolumes (it looks at deleted ones only). */
typedef struct StoreSpace {
        uint64_t reclaimable_bytes; /* held by deleted subvolumes, freed by the next reap */
        uint64_t fs_free_bytes;     /* free space of the host file system under the store */
        uint64_t fs_total_bytes;
        uint64_t fs_reserved_bytes; /* kept back for metadata and cleanup: data writes get
                                     * ENOSPC once the free space falls to it */
        uint64_t reserve_bytes;     /* held by the store's reserve file for cleaning up a disk
                                     * that something else filled; 0 while given back */
} StoreSpace;

int store_space(Store *s, StoreSpace *ret);

/* Space of the whole store: reads every live subvolume's layers. */
typedef struct StoreUsage {
        uint64_t logical_bytes;     /* sum over live subvolumes */
        uint64_t stored_bytes;      /* bytes of live blocks in packs, plus layer metadata */
        uint64_t data_bytes;        /* of which data blocks */
        uint64_t metadata_bytes;    /* of which layer and catalog databases */
        uint64_t blocks;            /* live data blocks */
        uint64_t pack_file_bytes;   /* bytes the pack files occupy on disk */
        uint64_t subvolumes;
        uint64_t damaged_subvolumes; /* of which damaged (StoreSubvolumeInfo) */
        uint64_t deleted_subvolumes;
        uint64_t layers;
        uint64_t corruption_events; /* checksum mismatches seen by reads and scrubs */
        StoreSpace space;
} StoreUsage;

int store_usage(Store *s, StoreUsage *ret);
/* The same, and the listing it was summed from (store_subvolume_list()),
 * so that a caller showing both reads the layers once and its rows add up
 * to its totals. */
int store_usage_listed(Store *s, StoreUsage *ret, StoreSubvolumeInfo **ret_infos, size_t *ret_n);

/* The reaper: forgets deleted subvolumes, folds layers that have a single
 * child into it, drops layers nothing uses and frees the blocks nothing
 * references. Only one reaper runs at a time: -EBUSY (and ret_holder) if
 * another holds it, unless wait is true. */
/* How much of long work is done, of how much: called a few times a second
 * at most, and once at the end. */
typedef void (*store_progress_cb)(uint64_t done, uint64_t total, void *userdata);

typedef struct StoreReapStats {
        uint64_t subvolumes_forgotten;
        uint64_t layers_dropped;
        uint64_t layers_folded;
        uint64_t blocks_freed;
        uint64_t bytes_freed;
} StoreReapStats;

/* Progress counts the bytes freed of those that wait to be (an estimate,
 * see store_space()); userdata goes to it. */
int store_reap(Store *s, bool wait, store_progress_cb progress, void *userdata, StoreReapStats *ret,
               pid_t *ret_holder);
/* -EAGAIN: the reaper is paused; what was freed before is in *ret. */

/* Settings every reaper of the store follows, kept in the catalog. Paused,
 * reapers stop at their next step and new ones do not start (-EAGAIN);
 * deleted subvolumes wait. The rate bounds the bytes a reaper frees per
 * second (0: no bound), so that it never floods the disk that serves the
 * foreground. In a hurry (free space is short), reapers ignore the rate. */
typedef struct StoreReaperSettings {
        bool paused;
        uint64_t rate_bytes_per_sec;
        bool hurried;
} StoreReaperSettings;

int store_reaper_settings(Store *s, StoreReaperSettings *ret);
int store_reaper_set_paused(Store *s, bool paused);
int store_reaper_set_rate(Store *s, uint64_t bytes_per_sec);

/* How long a hurry lasts unless it is asked for again: the process that
 * watches the free space asks at every look, and a hurry whose watcher
 * died ends by itself, the rate never changed. */
#define STORE_REAPER_HURRY_USEC (10 * 1000 * 1000)

/* Starts or renews a hurry (for STORE_REAPER_HURRY_USEC), or ends it. */
int store_reaper_hurry(Store *s, bool hurry);

/* Starts a detached reaper process for this store and returns at once;
 * what it has to say goes to the store's log. */
int store_reap_in_background(Store *s);

/* Claims: work a process does under temporary names, which a crash leaves
 * behind, is claimed under a name of its own (1 to 64 of a-z, 0-9 and
 * '-') for as long as the process lives: a lock the kernel releases when
 * it dies, which means the same in every PID namespace and after its PID
 * is reused. Held until released or the store is closed; -EEXIST if
 * another holds it. A child forked without exec() does not hold its
 * parent's claims. */
int store_claim(Store *s, const char *claim);
/* Releases a claim of this process and removes it; -ENOENT if not held. */
int store_claim_release(Store *s, const char *claim);
/* 1 if a live process holds the claim, 0 if nobody does. */
int store_claim_is_held(Store *s, const char *claim);
/* Removes the claims starting with prefix that nobody holds: those of
 * processes that died. Returns how many. */
int store_claims_clear(Store *s, const char *prefix);

/* A line of what went wrong where no caller hears of it, to standard error
 * (program[pid]: message); after store_log_to_file(), which a process that
 * left its caller calls, to the file "log" of the store, with the time. */
void store_log(const char *format, ...) __attribute__((format(printf, 1, 2)));
int store_log_to_file(Store *s);

/* Verifies every live block against its checksum. The callback is called
 * once per damaged block with the subvolumes and paths that use it. */
typedef struct StoreDamage {
        uint64_t pack;
        uint64_t offset;
        char digest[65];        /* hex; for damaged metadata, the layer or catalog record it is in */
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
        uint64_t rows_checked;  /* metadata records of the layers and the catalog */
        uint64_t rows_damaged;
        uint64_t catalog_rows_damaged; /* of those, the catalog's records of subvolumes and layers */
} StoreScrubStats;

/* Progress counts the bytes of the blocks checked; userdata goes to both
 * callbacks. A reaper that runs is waited for (it frees blocks and drops
 * layers, which would look like damage), and so are scrub and fsck by it. */
int store_scrub(Store *s, store_damage_cb cb, store_progress_cb progress, void *userdata, StoreScrubStats *ret);

/* Checks the catalog, every layer's metadata and the block index for
 * consistency. The callback is called once per problem found; problems
 * that fsck can repair without losing data (block reference counts, a next
 * inode number that is taken, counts of inodes and bytes that disagree with
 * the layers) are repaired when repair is true: -EBUSY if a subvolume is
 * mounted then. Returns the number of problems left unrepaired. Progress
 * counts the bytes of databases checked: the catalog and every layer, then
 * each subvolume's layers again as its tree is walked; userdata goes to
 * both callbacks. Like scrub, it waits for a reaper that runs. */
typedef void (*store_problem_cb)(const char *what, void *userdata);

int store_fsck(Store *s, bool repair, store_problem_cb cb, store_progress_cb progress, void *userdata);

/* Mounts a subvolume through FUSE at mountpoint and serves it until it is
 * unmounted (fusermount3 -u) or the process gets SIGTERM/SIGINT. A
 * writable subvolume can be mounted writable once: -EBUSY (ret_holder set)
 * if another process has it. To serve in the background, call it in a
 * process of its own and wait on ready_fd. */
typedef struct StoreMountOptions {
        bool readonly;          /* mount a writable subvolume read-only */
        bool detach;            /* once mounted, leave the session, the working
                                 * directory and the terminal, as a daemon does */
        bool debug;             /* libfuse debug output */
        unsigned max_threads;   /* 0: default */
        int ready_fd;           /* if >= 0: written "1\n" and closed once mounted */
        bool nofollow;          /* the mount point is an absolute path of
                                 * directories only: a symbolic link on its
                                 * way is refused, not followed */

        /* Files owned by root (uid or gid 0) appear owned by root_uid and
         * root_gid: a developer's workspace of an image that root made is
         * theirs to change, without a copy of any inode. */
        bool map_root;
        uid_t root_uid;
        gid_t root_gid;
} StoreMountOptions;

int store_mount(Store *s, const char *name, const char *mountpoint,
                const StoreMountOptions *opts, pid_t *ret_holder);

/* Returns a human description of a store error code where a bare strerror()
 * would mislead (e.g. -EPROTO: "store format is newer than this program"). */
const char *store_strerror(int error);

/*
 * Files of a subvolume, on inode numbers: what the FUSE front end serves
 * and what send streams are made from and applied to.
 *
 * All functions are thread-safe. Changes are made in memory and in an open
 * transaction of the top layer, committed as a group every second, on
 * volume_sync() and on close: a FUSE round trip never waits for a commit
 * unless it asked to (fsync).
 *
 * Inode numbers are stable for the life of the subvolume and kept by its
 * snapshots; the root is 1 (FUSE_ROOT_ID). Errors are negative errno
 * values as POSIX defines them for the matching system call.
 */

typedef struct Volume Volume;

#define VOLUME_ROOT_INO 1

/* Opens a subvolume. writable takes its exclusive write lock: -EBUSY, with
 * ret_holder set, if another process has it. A read-only subvolume can only
 * be opened read-only (-EROFS otherwise). */
int volume_open(Store *s, const char *name, bool writable, Volume **ret, pid_t *ret_holder);

/* Commits, releases the lock and frees. Returns NULL. */
Volume *volume_close(Volume *v);

/* Says in the lock that this volume is about to be closed (its mount is
 * gone, only the last commit is left): one who wants to open it waits for
 * that instead of failing with -EBUSY. */
void volume_closing(Volume *v);

bool volume_is_writable(const Volume *v);

/* Whether the layer below the top may change under this volume: false for
 * every volume today (frozen layers are immutable), so long cache timeouts
 * are safe. */
bool volume_is_sole_writer(const Volume *v);

/* What a snapshot asked for by another process calls first, without the
 * volume's lock, to write back what the kernel holds of the volume (the
 * dirty pages of shared mappings). */
void volume_set_write_back(Volume *v, int (*write_back)(void *userdata), void *userdata);

/* What a call that waits for the kernel to tell the volume something (a
 * write waiting for the FORGET of removed files) calls first, on its own
 * thread: the FUSE server lets another thread read its device meanwhile. */
void volume_set_before_wait(Volume *v, void (*before_wait)(void));

int volume_lookup(Volume *v, uint64_t parent, const char *name, struct stat *ret);
int volume_getattr(Volume *v, uint64_t ino, struct stat *ret);

/* Bits of valid for volume_setattr(). */
enum {
        VOLUME_SET_MODE      = 1 << 0,
        VOLUME_SET_UID       = 1 << 1,
        VOLUME_SET_GID       = 1 << 2,
        VOLUME_SET_SIZE      = 1 << 3,
        VOLUME_SET_ATIME     = 1 << 4,
        VOLUME_SET_MTIME     = 1 << 5,
        VOLUME_SET_ATIME_NOW = 1 << 6,
        VOLUME_SET_MTIME_NOW = 1 << 7,
};

int volume_setattr(Volume *v, uint64_t ino, const struct stat *attr, unsigned valid, struct stat *ret);

/* mode carries the file type: S_IFREG, S_IFIFO, S_IFSOCK, S_IFCHR or
 * S_IFBLK (rdev for the last two). -EEXIST if name exists. */
int volume_mknod(Volume *v, uint64_t parent, const char *name, mode_t mode, dev_t rdev,
                 uid_t uid, gid_t gid, struct stat *ret);
int volume_mkdir(Volume *v, uint64_t parent, const char *name, mode_t mode,
                 uid_t uid, gid_t gid, struct stat *ret);
int volume_symlink(Volume *v, uint64_t parent, const char *name, const char *target,
                   uid_t uid, gid_t gid, struct stat *ret);

/* Copies the target into buf (not NUL-terminated if it does not fit) and
 * returns its length. */
int volume_readlink(Volume *v, uint64_t ino, char *buf, size_t size);

int volume_link(Volume *v, uint64_t ino, uint64_t newparent, const char *newname, struct stat *ret);

/* An inode whose link count reaches zero stays readable until
 * volume_forget() says the kernel has no reference left to it. */
int volume_unlink(Volume *v, uint64_t parent, const char *name);
int volume_rmdir(Volume *v, uint64_t parent, const char *name);

/* flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE (from <linux/fs.h>). */
int volume_rename(Volume *v, uint64_t parent, const char *name,
                  uint64_t newparent, const char *newname, unsigned flags);

/* The kernel holds no reference to ino any more: an unlinked inode is
 * dropped now. */
void volume_forget(Volume *v, uint64_t ino);

/* Returns the number of bytes read (short only at end of file). A block
 * that fails its checksum gives -EIO and counts a corruption event. */
ssize_t volume_read(Volume *v, uint64_t ino, void *buf, size_t size, uint64_t offset);
ssize_t volume_write(Volume *v, uint64_t ino, const void *buf, size_t size, uint64_t offset);

/* mode: 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE,
 * FALLOC_FL_ZERO_RANGE (optionally |FALLOC_FL_KEEP_SIZE). -EOPNOTSUPP for
 * anything else. */
int volume_fallocate(Volume *v, uint64_t ino, int mode, uint64_t offset, uint64_t length);

/* Makes every change so far durable (data, metadata, block index). */
int volume_sync(Volume *v);

/* Makes ino's data and every metadata change durable. -ENOSPC if ino's
 * data does not fit on the disk; other files' data that does not fit stays
 * in memory and fails only their own fsync. */
int volume_fsync(Volume *v, uint64_t ino);

/* A directory's entries as they were when it was opened; "." and ".." are
 * not included. Entries come in the order of their cookies: a position in
 * the listing that depends on the name alone (a hash), so that a listing
 * read in parts goes on at the right entry even from a newer listing of
 * the directory. Cookies are at least VOLUME_DIR_FIRST_COOKIE; those below
 * are free for "." and "..". */
#define VOLUME_DIR_FIRST_COOKIE 3
typedef struct VolumeDirent {
        uint64_t ino;
        mode_t type;            /* S_IFMT bits */
        char *name;
        int64_t cookie;
} VolumeDirent;

typedef struct VolumeDir {
        uint64_t ino;
        uint64_t parent;
        size_t n;
        VolumeDirent *entries;
} VolumeDir;

int volume_opendir(Volume *v, uint64_t ino, VolumeDir **ret);
VolumeDir *volume_dir_free(VolumeDir *d);

/* flags: 0, XATTR_CREATE or XATTR_REPLACE. POSIX ACLs (system.posix_acl_
 * access and default) are kept as they are, as received, for a send to give
 * back; they are not enforced, and a mount does not show them. */
int volume_setxattr(Volume *v, uint64_t ino, const char *name, const void *value, size_t size, int flags);
/* size 0 returns the value's length; -ENODATA if absent, -ERANGE if it does
 * not fit. */
ssize_t volume_getxattr(Volume *v, uint64_t ino, const char *name, void *buf, size_t size);
/* NUL-separated names; size 0 returns the length needed. */
ssize_t volume_listxattr(Volume *v, uint64_t ino, char *buf, size_t size);
bool xattr_name_is_acl(const char *name);
int volume_removexattr(Volume *v, uint64_t ino, const char *name);

int volume_statfs(Volume *v, struct statvfs *ret);

/* The subvolume's name, as the mount's fsname. */
const char *volume_name(const Volume *v);

/* Makes dst's range [dst_offset, dst_offset + length) hold src's range
 * [src_offset, ...): whole blocks at aligned offsets are shared (no data is
 * read or written), the rest is copied. The file grows if the range ends
 * past its size. src may be dst (the ranges must not overlap) or another
 * open volume of the same store. */
int volume_clone_range(Volume *dst, uint64_t dst_ino, uint64_t dst_offset,
                       Volume *src, uint64_t src_ino, uint64_t src_offset, uint64_t length);

/* Files are stored in blocks of this size at aligned offsets. */
#define VOLUME_BLOCK_SIZE (64 * 1024)

/* One block of a file, for comparing files without reading them: two
 * blocks with equal digests hold equal bytes. */
typedef struct VolumeExtent {
        uint64_t offset;        /* a multiple of VOLUME_BLOCK_SIZE */
        uint32_t length;        /* bytes of the file in it */
        bool unsettled;         /* changed in memory, no digest yet */
        uint8_t digest[16];
} VolumeExtent;

/* The blocks of a regular file that hold data, below its size, in order
 * of offset: the rest of the file is holes. A file small enough to live
 * inline has none (-ENODATA). */
int volume_file_extents(Volume *v, uint64_t ino, VolumeExtent **ret, size_t *ret_n);

/* The zstd frame that stores a block, as it is in the pack, verified: 0 and
 * *ret_len set, or -ENODATA if the block is stored uncompressed. buf must
 * hold VOLUME_BLOCK_SIZE bytes. */
int volume_read_block_zstd(Volume *v, const uint8_t digest[16], void *buf, size_t *ret_len);
