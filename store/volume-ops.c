/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The name space of a volume: lookup, attributes, creation, links,
 * rename, directories and xattrs. */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

#include "sqlite-util.h"
#include "volume-internal.h"
#include "xxhash-util.h"

/* What a new name or xattr may take in the layer's database and journal. */
#define METADATA_COST 1024u

static int check_name(const char *name) {
        size_t n;

        if (!name)
                return -EINVAL;
        n = strlen(name);
        if (n == 0 || strchr(name, '/') || streq_dot(name))
                return -EINVAL;
        if (n > STORE_NAME_MAX)
                return -ENAMETOOLONG;
        return 0;
}

static int dir_get(Volume *v, uint64_t ino, bool for_write, InodeRow *ret) {
        int r;

        r = for_write ? inode_get_for_write(v, ino, ret) : inode_get(v, ino, ret);
        if (r < 0)
                return r;
        if (!S_ISDIR(ret->mode)) {
                inode_row_clear(ret);
                return -ENOTDIR;
        }
        return 0;
}

static void touch_parent(InodeRow *dir) {
        dir->mtime_ns = dir->ctime_ns = timestamp_now();
}

int volume_lookup(Volume *v, uint64_t parent, const char *name, struct stat *ret) {
        _cleanup_(inode_row_clear) InodeRow dir = {}, row = {};
        uint64_t ino;
        int r;

        r = check_name(name);
        if (r < 0)
                return r == -ENAMETOOLONG ? r : -ENOENT;

        MUTEX_LOCKED(&v->lock);
        r = dir_get(v, parent, false, &dir);
        if (r < 0)
                return r;
        r = dentry_get(v, parent, name, &ino, NULL);
        if (r < 0)
                return r;
        r = inode_get_attr(v, ino, &row);
        if (r == -ENOENT)
                return -EIO; /* an entry without its inode: damaged metadata */
        if (r < 0)
                return r;
        inode_to_stat(v, &row, ret);
        return 0;
}

int volume_getattr(Volume *v, uint64_t ino, struct stat *ret) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        int r;

        MUTEX_LOCKED(&v->lock);
        r = inode_get_attr(v, ino, &row);
        if (r < 0)
                return r;
        inode_to_stat(v, &row, ret);
        return 0;
}

static int inode_setattr(Volume *v, uint64_t ino, const struct stat *attr, unsigned valid, struct stat *ret) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        int64_t now = timestamp_now();
        int r;

        /* Only a change of size needs the content. */
        r = valid & VOLUME_SET_SIZE ? inode_get_for_write(v, ino, &row) : inode_get_attr_for_write(v, ino, &row);
        if (r < 0)
                return r;

        if (valid & VOLUME_SET_SIZE) {
                if (S_ISDIR(row.mode))
                        return -EISDIR;
                if (!S_ISREG(row.mode))
                        return -EINVAL;
                if (attr->st_size < 0)
                        return -EINVAL;
                if ((uint64_t) attr->st_size != row.size) {
                        /* The quota counts sizes: growing one is as a write. */
                        if ((uint64_t) attr->st_size > row.size) {
                                r = volume_check_quota(v, (uint64_t) attr->st_size - row.size);
                                if (r < 0)
                                        return r;
                        }
                        r = data_truncate(v, &row, (uint64_t) attr->st_size);
                        if (r < 0)
                                return r;
                }
                /* Also to the same size: the kernel leaves the times of
                 * open(O_TRUNC) and ftruncate() to us, and both change
                 * them (make's ': > stamp' touches). */
                row.mtime_ns = now;
        }
        if (valid & VOLUME_SET_MODE)
                row.mode = (row.mode & S_IFMT) | (attr->st_mode & 07777);
        if (valid & VOLUME_SET_UID)
                row.uid = attr->st_uid;
        if (valid & VOLUME_SET_GID)
                row.gid = attr->st_gid;
        if (valid & VOLUME_SET_ATIME_NOW)
                row.atime_ns = now;
        else if (valid & VOLUME_SET_ATIME)
                row.atime_ns = timestamp_from_timespec(&attr->st_atim);
        if (valid & VOLUME_SET_MTIME_NOW)
                row.mtime_ns = now;
        else if (valid & VOLUME_SET_MTIME)
                row.mtime_ns = timestamp_from_timespec(&attr->st_mtim);
        row.ctime_ns = now;

        r = inode_put(v, &row);
        if (r < 0)
                return r;
        if (ret)
                inode_to_stat(v, &row, ret);
        return 0;
}

int volume_setattr(Volume *v, uint64_t ino, const struct stat *attr, unsigned valid, struct stat *ret) {
        TopChange change;
        int r;

        MUTEX_LOCKED(&v->lock);
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: inode_setattr(v, ino, attr, valid, ret));
}

/* The new inode's row, its name and its parent's row, in the change that
 * inode_create() opened. */
static int inode_make(Volume *v, uint64_t parent, const char *name, mode_t mode, dev_t rdev,
                      uid_t uid, gid_t gid, const char *data, struct stat *ret) {
        _cleanup_(inode_row_clear) InodeRow dir = {}, row = {};
        int64_t now = timestamp_now();
        int r;

        r = dir_get(v, parent, true, &dir);
        if (r < 0)
                return r;
        if (dir.nlink == 0)
                return -ENOENT; /* removed while we were in it */
        r = dentry_get(v, parent, name, NULL, NULL);
        if (r >= 0)
                return -EEXIST;
        if (r != -ENOENT)
                return r;

        /* BSD group semantics in setgid directories, as the kernel does for
         * local file systems. */
        if (dir.mode & S_ISGID) {
                gid = dir.gid;
                if (S_ISDIR(mode))
                        mode |= S_ISGID;
        }

        row = (InodeRow) {
                .ino = v->counters.next_ino++,
                .mode = mode,
                .nlink = S_ISDIR(mode) ? 2 : 1,
                .uid = uid,
                .gid = gid,
                .rdev = (uint64_t) rdev,
                .atime_ns = now,
                .mtime_ns = now,
                .ctime_ns = now,
                .parent = S_ISDIR(mode) ? parent : 0,
                .lower_limit = 0,
        };
        if (S_ISREG(mode) || S_ISLNK(mode)) {
                row.has_data = true;
                if (data) {
                        row.data = (uint8_t *) strdup(data);
                        if (!row.data)
                                return -ENOMEM;
                        row.data_len = row.size = strlen(data);
                }
        }

        r = inode_put(v, &row);
        if (r < 0)
                return r;
        r = dentry_put(v, parent, name, row.ino, mode);
        if (r < 0)
                return r;
        v->counters.inodes++;

        if (S_ISDIR(mode))
                dir.nlink++;
        touch_parent(&dir);
        r = inode_put(v, &dir);
        if (r < 0)
                return r;
        if (ret)
                inode_to_stat(v, &row, ret);
        return 0;
}

/* Creates an inode and its first name in parent. data is the symlink's
 * target (regular files start inline and empty). */
static int inode_create(Volume *v, uint64_t parent, const char *name, mode_t mode, dev_t rdev,
                        uid_t uid, gid_t gid, const char *data, struct stat *ret) {
        TopChange change;
        int r;

        r = check_name(name);
        if (r < 0)
                return r;
        r = space_check(v->store, METADATA_COST + (data ? strlen(data) : 0), SPACE_METADATA);
        if (r < 0)
                return r;
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: inode_make(v, parent, name, mode, rdev, uid, gid, data, ret));
}

int volume_mknod(Volume *v, uint64_t parent, const char *name, mode_t mode, dev_t rdev,
                 uid_t uid, gid_t gid, struct stat *ret) {
        switch (mode & S_IFMT) {
        case S_IFREG:
        case S_IFIFO:
        case S_IFSOCK:
                rdev = 0;
                break;
        case S_IFCHR:
        case S_IFBLK:
                break;
        default:
                return -EINVAL;
        }
        MUTEX_LOCKED(&v->lock);
        return inode_create(v, parent, name, mode, rdev, uid, gid, NULL, ret);
}

int volume_mkdir(Volume *v, uint64_t parent, const char *name, mode_t mode,
                 uid_t uid, gid_t gid, struct stat *ret) {
        MUTEX_LOCKED(&v->lock);
        return inode_create(v, parent, name, S_IFDIR | (mode & 07777), 0, uid, gid, NULL, ret);
}

int volume_symlink(Volume *v, uint64_t parent, const char *name, const char *target,
                   uid_t uid, gid_t gid, struct stat *ret) {
        if (!target || !*target)
                return -ENOENT;
        if (strlen(target) >= PATH_MAX)
                return -ENAMETOOLONG;
        MUTEX_LOCKED(&v->lock);
        return inode_create(v, parent, name, S_IFLNK | 0777, 0, uid, gid, target, ret);
}

int volume_readlink(Volume *v, uint64_t ino, char *buf, size_t size) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        int r;

        MUTEX_LOCKED(&v->lock);
        r = inode_get(v, ino, &row);
        if (r < 0)
                return r;
        if (!S_ISLNK(row.mode))
                return -EINVAL;
        memcpy(buf, row.data, MIN(size, row.data_len));
        return (int) row.data_len;
}

static int link_name(Volume *v, uint64_t ino, uint64_t newparent, const char *newname, struct stat *ret) {
        _cleanup_(inode_row_clear) InodeRow dir = {}, row = {};
        int r;

        r = dir_get(v, newparent, true, &dir);
        if (r < 0)
                return r;
        r = inode_get_attr_for_write(v, ino, &row);
        if (r < 0)
                return r;
        if (S_ISDIR(row.mode))
                return -EPERM;
        /* As the kernel refuses it: a file without names stays so, and
         * the reaper drops it from layers nobody serves (fold.c). */
        if (row.nlink == 0)
                return -ENOENT;
        if (row.nlink >= 65000)
                return -EMLINK;
        r = dentry_get(v, newparent, newname, NULL, NULL);
        if (r >= 0)
                return -EEXIST;
        if (r != -ENOENT)
                return r;

        r = dentry_put(v, newparent, newname, ino, row.mode);
        if (r < 0)
                return r;
        row.nlink++;
        row.ctime_ns = timestamp_now();
        r = inode_put(v, &row);
        if (r < 0)
                return r;
        touch_parent(&dir);
        r = inode_put(v, &dir);
        if (r < 0)
                return r;
        if (ret)
                inode_to_stat(v, &row, ret);
        return 0;
}

int volume_link(Volume *v, uint64_t ino, uint64_t newparent, const char *newname, struct stat *ret) {
        TopChange change;
        int r;

        r = check_name(newname);
        if (r < 0)
                return r;

        MUTEX_LOCKED(&v->lock);
        r = space_check(v->store, METADATA_COST, SPACE_METADATA);
        if (r < 0)
                return r;
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: link_name(v, ino, newparent, newname, ret));
}

static int remove_name(Volume *v, uint64_t parent, const char *name, bool want_dir) {
        _cleanup_(inode_row_clear) InodeRow dir = {}, row = {};
        uint64_t ino;
        int r;

        r = dir_get(v, parent, true, &dir);
        if (r < 0)
                return r;
        r = dentry_get(v, parent, name, &ino, NULL);
        if (r < 0)
                return r;
        r = inode_get_attr_for_write(v, ino, &row);
        if (r < 0)
                return r;

        if (want_dir) {
                size_t n = 0;

                if (!S_ISDIR(row.mode))
                        return -ENOTDIR;
                r = dentries_list(v, ino, NULL, &n, true);
                if (r < 0)
                        return r;
                if (n > 0)
                        return -ENOTEMPTY;
                row.nlink = 0;
                dir.nlink--;
        } else {
                if (S_ISDIR(row.mode))
                        return -EISDIR;
                row.nlink--;
        }

        r = dentry_remove(v, parent, name);
        if (r < 0)
                return r;
        /* An inode without names stays until the kernel forgets it. */
        row.ctime_ns = timestamp_now();
        r = inode_put(v, &row);
        if (r < 0)
                return r;
        if (row.nlink == 0)
                inode_unlinked(v, &row);
        touch_parent(&dir);
        return inode_put(v, &dir);
}

static int remove_name_change(Volume *v, uint64_t parent, const char *name, bool want_dir) {
        TopChange change;
        int r;

        r = check_name(name);
        if (r < 0)
                return r == -ENAMETOOLONG ? r : -EINVAL;

        MUTEX_LOCKED(&v->lock);
        r = space_check(v->store, 0, SPACE_CLEANUP);
        if (r < 0)
                return r;
        r = top_change_begin(v, &change);
        r = top_change_end(v, &change, r ?: remove_name(v, parent, name, want_dir));
        if (r >= 0)
                volume_commit_if_short(v);
        return r;
}

int volume_unlink(Volume *v, uint64_t parent, const char *name) {
        return remove_name_change(v, parent, name, false);
}

int volume_rmdir(Volume *v, uint64_t parent, const char *name) {
        return remove_name_change(v, parent, name, true);
}

void volume_forget(Volume *v, uint64_t ino) {
        _cleanup_(inode_row_clear) InodeRow row = {};

        MUTEX_LOCKED(&v->lock);
        if (!v->writable || inode_get_attr(v, ino, &row) < 0 || row.nlink > 0)
                return;
        /* Unlinked before a snapshot froze its row: only its data in memory
         * is ours to drop. */
        if (row.layer == 0)
                (void) inode_drop(v, &row);
        else {
                data_forget_dirty(v, ino, 0, row.size);
                inode_forgotten(v, &row);
        }
}

/* A directory moves from one parent to another: link counts follow. */
static void move_dir(InodeRow *row, InodeRow *from, InodeRow *to) {
        if (!S_ISDIR(row->mode) || from == to)
                return;
        from->nlink--;
        to->nlink++;
        row->parent = to->ino;
}

static int rename_exchange(Volume *v, InodeRow *sp, InodeRow *dp, const char *name, const char *newname,
                           InodeRow *src, InodeRow *dst) {
        int64_t now = timestamp_now();
        int r;

        r = dentry_put(v, sp->ino, name, dst->ino, dst->mode);
        if (r >= 0)
                r = dentry_put(v, dp->ino, newname, src->ino, src->mode);
        if (r < 0)
                return r;
        move_dir(src, sp, dp);
        move_dir(dst, dp, sp);
        src->ctime_ns = dst->ctime_ns = now;
        r = inode_put(v, src);
        if (r >= 0)
                r = inode_put(v, dst);
        return r;
}

/* The target of a replacing rename loses its name. */
static int rename_check_replace(Volume *v, const InodeRow *src, InodeRow *dst, InodeRow *dp) {
        if (S_ISDIR(src->mode)) {
                size_t n = 0;
                int r;

                if (!S_ISDIR(dst->mode))
                        return -ENOTDIR;
                r = dentries_list(v, dst->ino, NULL, &n, true);
                if (r < 0)
                        return r;
                if (n > 0)
                        return -ENOTEMPTY;
                dst->nlink = 0;
                dp->nlink--;
        } else {
                if (S_ISDIR(dst->mode))
                        return -EISDIR;
                dst->nlink--;
        }
        if (dst->nlink == 0)
                inode_unlinked(v, dst);
        dst->ctime_ns = timestamp_now();
        return 0;
}

/* Deeper than any path the kernel can walk to: a loop of directories. */
#define DIR_DEPTH_MAX (PATH_MAX / 2)

/* 1 if directory dir is ino or lies below it: a directory moved into it
 * would be cut off from the root, holding itself. The kernel checks this
 * before a rename reaches us; a send stream's renames come straight here. */
static int dir_is_within(Volume *v, uint64_t dir, uint64_t ino) {
        for (unsigned depth = 0; dir != ino; depth++) {
                _cleanup_(inode_row_clear) InodeRow row = {};
                int r;

                if (dir == VOLUME_ROOT_INO)
                        return 0;
                if (depth >= DIR_DEPTH_MAX)
                        return -ELOOP;
                r = inode_get_attr(v, dir, &row);
                if (r < 0)
                        return r;
                dir = row.parent;
        }
        return 1;
}

static int rename_names(Volume *v, uint64_t parent, const char *name,
                        uint64_t newparent, const char *newname, unsigned flags) {
        _cleanup_(inode_row_clear) InodeRow p1 = {}, p2 = {}, src = {}, dst = {};
        InodeRow *sp = &p1, *dp = &p1;
        uint64_t src_ino, dst_ino = 0;
        int r;

        r = dir_get(v, parent, true, &p1);
        if (r < 0)
                return r;
        if (newparent != parent) {
                r = dir_get(v, newparent, true, &p2);
                if (r < 0)
                        return r;
                dp = &p2;
        }

        r = dentry_get(v, parent, name, &src_ino, NULL);
        if (r < 0)
                return r;
        r = dentry_get(v, newparent, newname, &dst_ino, NULL);
        if (r < 0 && r != -ENOENT)
                return r;
        if (r == -ENOENT && (flags & RENAME_EXCHANGE))
                return -ENOENT;
        if (r >= 0 && (flags & RENAME_NOREPLACE))
                return -EEXIST;
        if (dst_ino == src_ino)
                return 0; /* two names of one inode: POSIX says do nothing */

        r = inode_get_attr_for_write(v, src_ino, &src);
        if (r < 0)
                return r;
        if (dst_ino != 0) {
                r = inode_get_attr_for_write(v, dst_ino, &dst);
                if (r < 0)
                        return r;
        }
        if (newparent != parent) {
                r = S_ISDIR(src.mode) ? dir_is_within(v, newparent, src_ino) : 0;
                if (r == 0 && (flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode))
                        r = dir_is_within(v, parent, dst_ino);
                if (r != 0)
                        return r < 0 ? r : -EINVAL;
        }

        if (flags & RENAME_EXCHANGE)
                r = rename_exchange(v, sp, dp, name, newname, &src, &dst);
        else {
                if (dst_ino != 0) {
                        r = rename_check_replace(v, &src, &dst, dp);
                        if (r >= 0)
                                r = inode_put(v, &dst);
                        if (r < 0)
                                return r;
                }
                r = dentry_remove(v, parent, name);
                if (r >= 0)
                        r = dentry_put(v, newparent, newname, src_ino, src.mode);
                if (r < 0)
                        return r;
                move_dir(&src, sp, dp);
                src.ctime_ns = timestamp_now();
                r = inode_put(v, &src);
        }
        if (r < 0)
                return r;

        touch_parent(sp);
        r = inode_put(v, sp);
        if (r >= 0 && dp != sp) {
                touch_parent(dp);
                r = inode_put(v, dp);
        }
        return r;
}

int volume_rename(Volume *v, uint64_t parent, const char *name,
                  uint64_t newparent, const char *newname, unsigned flags) {
        TopChange change;
        int r;

        if (flags & ~(unsigned) (RENAME_NOREPLACE | RENAME_EXCHANGE))
                return -EINVAL;
        if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
                return -EINVAL;
        r = check_name(name);
        if (r >= 0)
                r = check_name(newname);
        if (r < 0)
                return r;

        MUTEX_LOCKED(&v->lock);
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: rename_names(v, parent, name, newparent, newname, flags));
}

static int64_t dirent_cookie(const char *name) {
        return VOLUME_DIR_FIRST_COOKIE + (int64_t) (XXH3_64bits(name, strlen(name)) % (INT64_MAX - VOLUME_DIR_FIRST_COOKIE));
}

static int dirent_compare(const void *a, const void *b) {
        const VolumeDirent *x = a, *y = b;

        return x->cookie < y->cookie ? -1 : x->cookie > y->cookie;
}

/* Sorts the entries by cookie. Two names of one hash (one chance in 2^63
 * per pair) get neighbouring cookies: each cookie names one entry. */
static void dirents_order(VolumeDirent *entries, size_t n) {
        for (size_t i = 0; i < n; i++)
                entries[i].cookie = dirent_cookie(entries[i].name);
        if (n > 1)
                qsort(entries, n, sizeof *entries, dirent_compare);
        for (size_t i = 1; i < n; i++)
                if (entries[i].cookie <= entries[i - 1].cookie)
                        entries[i].cookie = entries[i - 1].cookie + 1;
}

int volume_opendir(Volume *v, uint64_t ino, VolumeDir **ret) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        VolumeDir *d;
        int r;

        MUTEX_LOCKED(&v->lock);
        r = dir_get(v, ino, false, &row);
        if (r < 0)
                return r;
        d = calloc(1, sizeof *d);
        if (!d)
                return -ENOMEM;
        d->ino = ino;
        d->parent = ino == VOLUME_ROOT_INO ? ino : row.parent;
        r = dentries_list(v, ino, &d->entries, &d->n, false);
        if (r < 0) {
                free(d);
                return r;
        }
        dirents_order(d->entries, d->n);
        *ret = d;
        return 0;
}

VolumeDir *volume_dir_free(VolumeDir *d) {
        if (!d)
                return NULL;
        for (size_t i = 0; i < d->n; i++)
                free(d->entries[i].name);
        free(d->entries);
        free(d);
        return NULL;
}

/* ---- xattrs: an inode's set lives in the topmost layer with its row ---- */

static int xattr_check_name(const char *name) {
        size_t n = name ? strlen(name) : 0;

        if (n == 0)
                return -EINVAL;
        if (n > XATTR_NAME_MAX)
                return -ERANGE;
        return 0;
}

bool xattr_name_is_acl(const char *name) {
        return startswith(name, "system.posix_acl_");
}

/* POSIX ACLs come in send streams of trees that have them: kept as they
 * are, for a send to give back, but not enforced, as on a file system
 * mounted with noacl: the mode of a file is its permissions. A mount
 * shows none (without FUSE's ACL support the kernel refuses their names).
 * What is kept must be an ACL in the kernel's form: a header of version
 * 2, then entries of 8 bytes. */
static int acl_check(const char *name, const uint8_t *value, size_t size) {
        if (!streq(name, "system.posix_acl_access") && !streq(name, "system.posix_acl_default"))
                return -EOPNOTSUPP;
        if (size < 4 || (size - 4) % 8 != 0 || value[0] != 2 || value[1] != 0 || value[2] != 0 || value[3] != 0)
                return -EINVAL;
        return 0;
}

static int xattr_find(Volume *v, const InodeRow *row, const char *name, sqlite3_stmt **ret) {
        sqlite3_stmt *st = v->layers[row->layer].get_xattr;
        int r;

        sqlite3_bind_int64(st, 1, (sqlite3_int64) row->ino);
        sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r > 0)
                r = volume_row_intact(v, st, 1) ?: 1;
        if (r <= 0) {
                sqlite3_reset(st);
                return r < 0 ? r : -ENODATA;
        }
        *ret = st; /* caller resets */
        return 0;
}

/* The length of the inode's list of names, as listxattr() returns it. */
static int xattr_names_size(Volume *v, const InodeRow *row, size_t *ret) {
        sqlite3_stmt *st = v->layers[row->layer].list_xattrs;
        size_t total = 0;
        int r;

        sqlite3_bind_int64(st, 1, (sqlite3_int64) row->ino);
        while ((r = sqlite_step_row(st)) > 0)
                total += (size_t) sqlite3_column_bytes(st, 0) + 1;
        sqlite3_reset(st);
        *ret = total;
        return r;
}

static int xattr_set(Volume *v, uint64_t ino, const char *name, const void *value, size_t size, int flags) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        sqlite3_stmt *st;
        bool exists;
        int r;

        r = inode_get_attr_for_write(v, ino, &row);
        if (r < 0)
                return r;
        r = xattr_find(v, &row, name, &st);
        if (r < 0 && r != -ENODATA)
                return r;
        exists = r >= 0;
        if (exists)
                sqlite3_reset(st);
        if ((flags & XATTR_CREATE) && exists)
                return -EEXIST;
        if ((flags & XATTR_REPLACE) && !exists)
                return -ENODATA;
        /* A new name must leave the list within what listxattr() can
         * return; ext4 runs out of room (ENOSPC) far sooner. */
        if (!exists) {
                size_t names = 0;

                r = xattr_names_size(v, &row, &names);
                if (r < 0)
                        return r;
                if (names + strlen(name) + 1 > XATTR_LIST_MAX)
                        return -ENOSPC;
        }

        st = v->top.put_xattr;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
        sqlite3_bind_blob(st, 3, size > 0 ? value : "", (int) size, SQLITE_STATIC);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        row.ctime_ns = timestamp_now();
        return inode_put(v, &row);
}

int volume_setxattr(Volume *v, uint64_t ino, const char *name, const void *value, size_t size, int flags) {
        TopChange change;
        int r;

        r = xattr_check_name(name);
        if (r < 0)
                return r;
        if (size > XATTR_SIZE_MAX)
                return -E2BIG;
        if (xattr_name_is_acl(name)) {
                r = acl_check(name, value, size);
                if (r < 0)
                        return r;
        }

        MUTEX_LOCKED(&v->lock);
        r = space_check(v->store, METADATA_COST + size, SPACE_METADATA);
        if (r < 0)
                return r;
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: xattr_set(v, ino, name, value, size, flags));
}

ssize_t volume_getxattr(Volume *v, uint64_t ino, const char *name, void *buf, size_t size) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        sqlite3_stmt *st;
        size_t len;
        int r;

        r = xattr_check_name(name);
        if (r < 0)
                return r;

        MUTEX_LOCKED(&v->lock);
        r = inode_get_attr(v, ino, &row);
        if (r < 0)
                return r;
        r = xattr_find(v, &row, name, &st);
        if (r < 0)
                return r;
        len = (size_t) sqlite3_column_bytes(st, 0);
        if (size > 0) {
                if (len > size) {
                        sqlite3_reset(st);
                        return -ERANGE;
                }
                if (len > 0)
                        memcpy(buf, sqlite3_column_blob(st, 0), len);
        }
        sqlite3_reset(st);
        return (ssize_t) len;
}

ssize_t volume_listxattr(Volume *v, uint64_t ino, char *buf, size_t size) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        sqlite3_stmt *st;
        size_t total = 0;
        int r;

        MUTEX_LOCKED(&v->lock);
        r = inode_get_attr(v, ino, &row);
        if (r < 0)
                return r;
        st = v->layers[row.layer].list_xattrs;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        while ((r = sqlite_step_row(st)) > 0) {
                size_t n = (size_t) sqlite3_column_bytes(st, 0);

                r = volume_row_intact(v, st, 1);
                if (r < 0)
                        break;
                if (size > 0) {
                        if (total + n + 1 > size) {
                                sqlite3_reset(st);
                                return -ERANGE;
                        }
                        memcpy(buf + total, sqlite3_column_blob(st, 0), n);
                        buf[total + n] = 0;
                }
                total += n + 1;
        }
        sqlite3_reset(st);
        if (r < 0)
                return r;
        return (ssize_t) total;
}

static int xattr_remove(Volume *v, uint64_t ino, const char *name) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        sqlite3_stmt *st;
        int r;

        r = inode_get_attr_for_write(v, ino, &row);
        if (r < 0)
                return r;
        r = xattr_find(v, &row, name, &st);
        if (r < 0)
                return r;
        sqlite3_reset(st);

        st = v->top.delete_xattr;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        row.ctime_ns = timestamp_now();
        return inode_put(v, &row);
}

int volume_removexattr(Volume *v, uint64_t ino, const char *name) {
        TopChange change;
        int r;

        r = xattr_check_name(name);
        if (r < 0)
                return r;

        MUTEX_LOCKED(&v->lock);
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: xattr_remove(v, ino, name));
}

int volume_statfs(Volume *v, struct statvfs *ret) {
        uint64_t inodes, quota, used, blocks, bfree, bavail, margin, names;
        struct statvfs host;

        if (fstatvfs(v->store->dir_fd, &host) < 0)
                return -errno;
        {
                MUTEX_LOCKED(&v->lock);
                inodes = v->counters.inodes;
                quota = v->quota_bytes;
                used = v->counters.logical_bytes + v->orphan_bytes;
        }

        /* Space is the host file system's, where the packs live, less the
         * margin that writes of data leave free (space_check()): a program
         * that asks how much fits before it writes (package managers, git)
         * must not be told of room that a write is refused. */
        blocks = (uint64_t) host.f_blocks * host.f_frsize / 4096;
        bfree = (uint64_t) host.f_bfree * host.f_frsize / 4096;
        bavail = (uint64_t) host.f_bavail * host.f_frsize / 4096;
        margin = space_margin_of(blocks * 4096) / 4096;
        names = bavail - MIN(bavail, margin / 2);    /* new names may use half of it */
        bavail -= MIN(bavail, margin);
        bfree = MAX(bavail, bfree - MIN(bfree, margin));
        /* A quota is the size of the subvolume's file system, as project
         * quotas are on ext4 and XFS: df shows the limit and what is left
         * of it. */
        if (quota > 0) {
                uint64_t left = quota > used ? (quota - used) / 4096 : 0;

                blocks = MIN(blocks, quota / 4096);
                bfree = MIN(bfree, left);
                bavail = MIN(bavail, left);
        }

        /* The inode count is this subvolume's, with room to grow as far as
         * space allows: a quota counts bytes, not names. */
        *ret = (struct statvfs) {
                .f_bsize = 4096,
                .f_frsize = 4096,
                .f_blocks = (fsblkcnt_t) blocks,
                .f_bfree = (fsblkcnt_t) bfree,
                .f_bavail = (fsblkcnt_t) bavail,
                .f_files = (fsfilcnt_t) (inodes + names),
                .f_ffree = (fsfilcnt_t) names,
                .f_favail = (fsfilcnt_t) names,
                .f_namemax = STORE_NAME_MAX,
        };
        return 0;
}
