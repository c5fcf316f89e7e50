/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * volume.h (internal to store/): a subvolume opened for serving, with file
 * system operations on inode numbers. The FUSE front end (fuse.c) is a thin
 * translation of these; they hold no file descriptor per inode.
 *
 * All functions are thread-safe. Changes are made in memory and in an open
 * transaction of the top layer, committed as a group every second, on
 * volume_sync() and on close: a FUSE round trip never waits for a commit
 * unless it asked to (fsync).
 *
 * Inode numbers are stable for the life of the subvolume; the root is 1
 * (FUSE_ROOT_ID). Errors are negative errno values as POSIX defines them for
 * the matching system call.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "store.h"

typedef struct Volume Volume;

#define VOLUME_ROOT_INO 1

/* Opens a subvolume. writable takes its exclusive write lock: -EBUSY, with
 * ret_holder set, if another process has it. A read-only subvolume can only
 * be opened read-only (-EROFS otherwise). */
int volume_open(Store *s, const char *name, bool writable, Volume **ret, pid_t *ret_holder);

/* Commits, releases the lock and frees. Returns NULL. */
Volume *volume_close(Volume *v);

bool volume_is_writable(const Volume *v);

/* Whether the layer below the top may change under this volume: false for
 * every volume today (frozen layers are immutable), so long cache timeouts
 * are safe. */
bool volume_is_sole_writer(const Volume *v);

/* Whether the kernel keeps the times of written files (FUSE writeback
 * cache): then write and fallocate leave mtime and ctime alone. */
void volume_set_kernel_times(Volume *v, bool kernel_times);

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
        VOLUME_SET_CTIME     = 1 << 8,
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
 * not included. */
typedef struct VolumeDirent {
        uint64_t ino;
        mode_t type;            /* S_IFMT bits */
        char *name;
} VolumeDirent;

typedef struct VolumeDir {
        uint64_t ino;
        uint64_t parent;
        size_t n;
        VolumeDirent *entries;
} VolumeDir;

int volume_opendir(Volume *v, uint64_t ino, VolumeDir **ret);
VolumeDir *volume_dir_free(VolumeDir *d);

/* flags: 0, XATTR_CREATE or XATTR_REPLACE. */
int volume_setxattr(Volume *v, uint64_t ino, const char *name, const void *value, size_t size, int flags);
/* size 0 returns the value's length; -ENODATA if absent, -ERANGE if it does
 * not fit. */
ssize_t volume_getxattr(Volume *v, uint64_t ino, const char *name, void *buf, size_t size);
/* NUL-separated names; size 0 returns the length needed. */
ssize_t volume_listxattr(Volume *v, uint64_t ino, char *buf, size_t size);
int volume_removexattr(Volume *v, uint64_t ino, const char *name);

int volume_statfs(Volume *v, struct statvfs *ret);

/* The subvolume's name, as the mount's fsname. */
const char *volume_name(const Volume *v);
