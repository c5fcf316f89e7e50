/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The FUSE front end of a subvolume: libfuse3's low-level API translated to
 * the inode operations of volume.h.
 *
 * Caching. This process is the only writer of the subvolume it serves
 * (volume_is_sole_writer()), so the kernel may keep what it learns for long:
 * entries, attributes and negative entries live for an hour, file pages
 * survive close and reopen, directory listings are cached (the kernel drops
 * a cached listing when it creates, removes or renames in the directory
 * itself). Every change the kernel does not see coming goes through a reply
 * that carries the new attributes; for unlink, rmdir and rename the kernel
 * updates its own dentries and attributes.
 * Should a volume ever not be the sole writer, timeouts drop to a second
 * and nothing else is cached.
 *
 * Round trips. A file's open and close cost a request each, and make every
 * cat or compiler run wait for this process. Opening holds nothing here:
 * the first OPEN is answered ENOSYS, after which the kernel opens files on
 * its own, keeping their pages (and sends no RELEASE); a read-only volume is
 * mounted read-only, so the kernel refuses opens for writing itself. There
 * is no FLUSH handler either: nothing is buffered per open file, and
 * durability is fsync's.
 *
 * Writes. Every write() reaches this process before it returns: no
 * writeback cache. So a full disk or the size limit fails the write()
 * itself, a snapshot holds every write() that returned, and the kernel
 * keeps a file's attributes after close. With the writeback cache it
 * forgets the file's block count at every close (a GETATTR at the next
 * stat: repeated warm reads took 3.5 times as long), and the errors of its
 * writeback come back as EIO at a close() few check. Only shared mappings
 * leave dirty pages in the kernel: a snapshot has the kernel write them
 * back first, which gets them there when it can (this kernel's syncfs()
 * starts a FUSE file system's writeback but does not wait for it; msync()
 * does).
 *
 * Lookup counts. Every entry the kernel receives (lookup, mknod, mkdir,
 * symlink, link, create, and each readdirplus entry but "." and "..") is
 * counted in the inode table before it is sent, and taken back if the reply
 * did not reach the kernel; forget and forget_multi subtract. When a count
 * reaches zero the record goes and volume_forget() may drop an unlinked
 * inode. No file descriptor is held per inode.
 *
 * Each operation is split in two: a do_x() body returns a negative errno and
 * its op_x() wrapper replies exactly once. Where the volume call is the whole
 * body, the wrapper calls it directly.
 */

#define FUSE_USE_VERSION 314

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fd-util.h"
#include "fuse-loop.h"
#include "mutex-util.h"
#include "store.h"
#include "string-util.h"

#define CACHE_TIMEOUT_SOLE_WRITER 3600.0 /* seconds */
#define CACHE_TIMEOUT_SHARED 1.0
#define IO_SIZE_MAX (1024u * 1024u)      /* max_write, and the largest READ */
#define READ_AHEAD_BYTES (2u * IO_SIZE_MAX) /* two READs in flight at once */
#define MAX_THREADS_DEFAULT 8u          /* at most, by default */
#define INODE_TABLE_MIN_SLOTS 64
#define LISTING_SLOTS 16                /* directories listed at once without opendir */

/* ---- the server ---- */

/* A lookup count per inode the kernel knows: open addressing with linear
 * probing, keyed by inode number (0 marks a free slot). */
typedef struct InodeCount {
        uint64_t ino;
        uint64_t nlookup;
} InodeCount;

typedef struct InodeTable {
        pthread_mutex_t lock;
        InodeCount *slots;
        size_t n_slots;         /* 0 or a power of two; at least one slot stays free */
        size_t n_used;
} InodeTable;

/* Listings of directories read without opendir (the sole writer's kernel
 * lists on its own and keeps what it read): one is made when a listing
 * starts at offset 0 and dropped when it was read to its end; cookies
 * that hash the names let a listing that was dropped early go on in a
 * new one. */
typedef struct ListingSlot {
        VolumeDir *dir;
        uint64_t last_used;     /* 0 while empty */
} ListingSlot;

typedef struct Listings {
        pthread_mutex_t lock;
        ListingSlot slots[LISTING_SLOTS];
        uint64_t clock;
} Listings;

typedef struct Server {
        Volume *volume;
        InodeTable inodes;

        /* Settings, fixed before the session starts. */
        bool writable;
        double entry_timeout;
        double attr_timeout;
        double negative_timeout; /* 0: ENOENT is not cached */
        bool keep_cache;
        bool no_open;           /* the kernel opens files without asking */
        bool no_opendir;        /* ... and directories */
        bool cache_readdir;
        Listings listings;
        bool map_root;          /* files of root appear as root_uid's */
        uid_t root_uid;
        gid_t root_gid;
        const char *mountpoint;
} Server;

static Server *server_of(fuse_req_t req) {
        return fuse_req_userdata(req);
}

/* ---- the inode table ---- */

static size_t inode_hash(uint64_t ino, size_t mask) {
        ino ^= ino >> 33;
        ino *= UINT64_C(0xff51afd7ed558ccd);
        ino ^= ino >> 33;
        return (size_t) ino & mask;
}

/* The slot that holds ino, or the free slot where it would go. */
static size_t table_slot(const InodeTable *t, uint64_t ino) {
        size_t mask = t->n_slots - 1;

        for (size_t i = inode_hash(ino, mask);; i = (i + 1) & mask)
                if (t->slots[i].ino == ino || t->slots[i].ino == 0)
                        return i;
}

static int table_grow(InodeTable *t) {
        size_t n = t->n_slots > 0 ? t->n_slots * 2 : INODE_TABLE_MIN_SLOTS;
        InodeCount *old = t->slots, *slots;
        size_t n_old = t->n_slots;

        slots = calloc(n, sizeof *slots);
        if (!slots)
                return -ENOMEM;
        t->slots = slots;
        t->n_slots = n;
        for (size_t i = 0; i < n_old; i++)
                if (old[i].ino != 0)
                        t->slots[table_slot(t, old[i].ino)] = old[i];
        free(old);
        return 0;
}

/* Whether x lies in (a, b] on the ring of slots. */
static bool ring_between(size_t a, size_t x, size_t b) {
        return a <= b ? a < x && x <= b : a < x || x <= b;
}

/* Empties slot i and moves later records of its probe run back into the
 * hole, so that no lookup needs tombstones. */
static void table_remove(InodeTable *t, size_t i) {
        size_t mask = t->n_slots - 1;

        for (size_t j = (i + 1) & mask; t->slots[j].ino != 0; j = (j + 1) & mask)
                if (!ring_between(i, inode_hash(t->slots[j].ino, mask), j)) {
                        t->slots[i] = t->slots[j];
                        i = j;
                }
        t->slots[i] = (InodeCount) {};
        t->n_used--;
}

/* Counts one lookup of ino that the kernel is about to receive. */
static int lookup_ref(Server *srv, uint64_t ino) {
        InodeTable *t = &srv->inodes;
        size_t i;
        int r;

        if (ino == 0)
                return -EIO;

        MUTEX_LOCKED(&t->lock);
        if (t->n_slots > 0) {
                i = table_slot(t, ino);
                if (t->slots[i].ino == ino) {
                        t->slots[i].nlookup++;
                        return 0;
                }
        }
        if ((t->n_used + 1) * 4 > t->n_slots * 3) {
                r = table_grow(t);
                /* Probing works as long as one slot stays free: growing can wait. */
                if (r < 0 && t->n_used + 1 >= t->n_slots)
                        return r;
        }
        i = table_slot(t, ino);
        t->slots[i] = (InodeCount) { .ino = ino, .nlookup = 1 };
        t->n_used++;
        return 0;
}

/* Takes away n lookups of ino; at zero the kernel holds no reference, and
 * the volume may drop the inode if it has no name left. volume_forget() is
 * called under the table's lock, so that a lookup of the same inode cannot
 * be counted between the last forget and the drop. */
static void lookup_unref(Server *srv, uint64_t ino, uint64_t n) {
        InodeTable *t = &srv->inodes;
        size_t i;

        if (ino == 0)
                return;

        MUTEX_LOCKED(&t->lock);
        if (t->n_slots == 0)
                return;
        i = table_slot(t, ino);
        if (t->slots[i].ino != ino)
                return; /* never counted (the root), nothing to take away */
        if (t->slots[i].nlookup > n) {
                t->slots[i].nlookup -= n;
                return;
        }
        table_remove(t, i);
        volume_forget(srv->volume, ino);
}

/* ---- replies ---- */

static void reply_status(fuse_req_t req, int r) {
        fuse_reply_err(req, r < 0 ? -r : 0);
}

/* The owner as the kernel sees it: a workspace's files that came from a
 * root-made image belong to its developer, with no copy of any of them. */
static void owner_map(const Server *srv, struct stat *st) {
        if (!srv->map_root)
                return;
        if (st->st_uid == 0)
                st->st_uid = srv->root_uid;
        if (st->st_gid == 0)
                st->st_gid = srv->root_gid;
}

static void entry_fill(const Server *srv, const struct stat *st, struct fuse_entry_param *ret) {
        *ret = (struct fuse_entry_param) {
                .ino = st->st_ino,
                .generation = 0, /* inode numbers are never reused */
                .attr = *st,
                .attr_timeout = srv->attr_timeout,
                .entry_timeout = srv->entry_timeout,
        };
        owner_map(srv, &ret->attr);
}

/* Replies an entry and counts it. The count comes first, since a forget may
 * follow the reply at once, and is taken back if the reply failed: the
 * kernel then never saw the entry and will not forget it. */
static void reply_entry(fuse_req_t req, int r, const struct stat *st) {
        Server *srv = server_of(req);
        struct fuse_entry_param e;

        if (r >= 0)
                r = lookup_ref(srv, st->st_ino);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        entry_fill(srv, st, &e);
        if (fuse_reply_entry(req, &e) < 0)
                lookup_unref(srv, st->st_ino, 1);
}

/* A name that does not exist: cached as a negative entry, which is safe
 * only because every creation goes through this server and the kernel. */
static void reply_negative(fuse_req_t req) {
        Server *srv = server_of(req);

        if (srv->negative_timeout > 0)
                fuse_reply_entry(req, &(struct fuse_entry_param) { .entry_timeout = srv->negative_timeout });
        else
                fuse_reply_err(req, ENOENT);
}

static void reply_attr(fuse_req_t req, int r, const struct stat *st) {
        Server *srv = server_of(req);
        struct stat mapped;

        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        mapped = *st;
        owner_map(srv, &mapped);
        fuse_reply_attr(req, &mapped, srv->attr_timeout);
}

/* ---- connection ---- */

static void op_init(void *userdata, struct fuse_conn_info *conn) {
        Server *srv = userdata;
        unsigned on = FUSE_CAP_READDIRPLUS | FUSE_CAP_ASYNC_READ | FUSE_CAP_PARALLEL_DIROPS |
                FUSE_CAP_CACHE_SYMLINKS;
        /* Off: the writeback cache (see Writes above); listing without
         * attributes now and then (READDIRPLUS_AUTO);
         * splice; the server clearing setuid bits (without HANDLE_KILLPRIV
         * the kernel sends the mode change as a setattr); O_TRUNC in open
         * (without ATOMIC_O_TRUNC the kernel truncates through setattr
         * first, and strips O_TRUNC from the open). */
        unsigned off = FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_READDIRPLUS_AUTO | FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE |
                FUSE_CAP_SPLICE_MOVE | FUSE_CAP_HANDLE_KILLPRIV | FUSE_CAP_ATOMIC_O_TRUNC |
                FUSE_CAP_EXPORT_SUPPORT | FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;

        /* The sole writer's pages never change behind the kernel's back:
         * files may be opened without asking, their pages kept. */
        if (srv->keep_cache) {
                off |= FUSE_CAP_AUTO_INVAL_DATA;
                on |= FUSE_CAP_NO_OPEN_SUPPORT;
        }
        /* Nor do its directories change: listed without opendir, and kept. */
        if (srv->cache_readdir)
                on |= FUSE_CAP_NO_OPENDIR_SUPPORT;

        conn->want = (conn->want & ~off) | (on & conn->capable);
        srv->no_open = conn->want & FUSE_CAP_NO_OPEN_SUPPORT;
        srv->no_opendir = conn->want & FUSE_CAP_NO_OPENDIR_SUPPORT;

        conn->max_write = MIN(conn->max_write, IO_SIZE_MAX); /* libfuse caps it to its buffer */
        conn->max_readahead = READ_AHEAD_BYTES;              /* the kernel keeps the smaller of its own and ours */
        conn->time_gran = 1;                                 /* the volume keeps nanoseconds */
}

/* ---- names ---- */

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
        struct stat st;
        int r;

        r = volume_lookup(server_of(req)->volume, parent, name, &st);
        if (r == -ENOENT)
                reply_negative(req);
        else
                reply_entry(req, r, &st);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
        lookup_unref(server_of(req), ino, nlookup);
        fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
        Server *srv = server_of(req);

        for (size_t i = 0; i < count; i++)
                lookup_unref(srv, forgets[i].ino, forgets[i].nlookup);
        fuse_reply_none(req);
}

static int do_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev,
                    struct stat *ret) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);

        /* The kernel applied the umask already (no FUSE_CAP_DONT_MASK). */
        if (S_ISDIR(mode))
                return volume_mkdir(server_of(req)->volume, parent, name, mode, ctx->uid, ctx->gid, ret);
        return volume_mknod(server_of(req)->volume, parent, name, mode, rdev, ctx->uid, ctx->gid, ret);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
        struct stat st;
        int r;

        r = do_mknod(req, parent, name, mode, rdev, &st);
        reply_entry(req, r, &st);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
        struct stat st;
        int r;

        r = do_mknod(req, parent, name, S_IFDIR | (mode & 07777), 0, &st);
        reply_entry(req, r, &st);
}

static void op_symlink(fuse_req_t req, const char *target, fuse_ino_t parent, const char *name) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        struct stat st;
        int r;

        r = volume_symlink(server_of(req)->volume, parent, name, target, ctx->uid, ctx->gid, &st);
        reply_entry(req, r, &st);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname) {
        struct stat st;
        int r;

        r = volume_link(server_of(req)->volume, ino, newparent, newname, &st);
        reply_entry(req, r, &st);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
        reply_status(req, volume_unlink(server_of(req)->volume, parent, name));
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
        reply_status(req, volume_rmdir(server_of(req)->volume, parent, name));
}

static int do_rename(Server *srv, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                     const char *newname, unsigned flags) {
        if (flags & ~(unsigned) (RENAME_NOREPLACE | RENAME_EXCHANGE))
                return -EINVAL;
        if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
                return -EINVAL;
        return volume_rename(srv->volume, parent, name, newparent, newname, flags);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned flags) {
        reply_status(req, do_rename(server_of(req), parent, name, newparent, newname, flags));
}

/* ---- attributes ---- */

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
        struct stat st;
        int r;

        r = volume_getattr(server_of(req)->volume, ino, &st);
        reply_attr(req, r, &st);
}

static unsigned setattr_valid(int to_set) {
        static const struct {
                int fuse;
                unsigned volume;
        } map[] = {
                { FUSE_SET_ATTR_MODE, VOLUME_SET_MODE },
                { FUSE_SET_ATTR_UID, VOLUME_SET_UID },
                { FUSE_SET_ATTR_GID, VOLUME_SET_GID },
                { FUSE_SET_ATTR_SIZE, VOLUME_SET_SIZE },
                { FUSE_SET_ATTR_ATIME, VOLUME_SET_ATIME },
                { FUSE_SET_ATTR_MTIME, VOLUME_SET_MTIME },
                { FUSE_SET_ATTR_ATIME_NOW, VOLUME_SET_ATIME_NOW },
                { FUSE_SET_ATTR_MTIME_NOW, VOLUME_SET_MTIME_NOW },
        };
        unsigned valid = 0;

        for (size_t i = 0; i < ELEMENTSOF(map); i++)
                if (to_set & map[i].fuse)
                        valid |= map[i].volume;
        return valid;
}

static int do_setattr(Server *srv, fuse_ino_t ino, const struct stat *attr, int to_set, struct stat *ret) {
        unsigned valid = setattr_valid(to_set);

        if (valid == 0)
                return volume_getattr(srv->volume, ino, ret);
        return volume_setattr(srv->volume, ino, attr, valid, ret);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi) {
        struct stat st;
        int r;

        r = do_setattr(server_of(req), ino, attr, to_set, &st);
        reply_attr(req, r, &st);
}

static int do_readlink(Server *srv, fuse_ino_t ino, char *buf, size_t size) {
        int n;

        n = volume_readlink(srv->volume, ino, buf, size - 1);
        if (n < 0)
                return n;
        if ((size_t) n >= size - 1)
                return -ENAMETOOLONG;
        buf[n] = 0;
        return 0;
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino) {
        char target[PATH_MAX + 1];
        int r;

        r = do_readlink(server_of(req), ino, target, sizeof target);
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_readlink(req, target);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino) {
        struct statvfs sv;
        int r;

        r = volume_statfs(server_of(req)->volume, &sv);
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_statfs(req, &sv);
}

/* ---- files ---- */

static int do_open(Server *srv, fuse_ino_t ino, struct fuse_file_info *fi) {
        if ((fi->flags & O_ACCMODE) != O_RDONLY && !srv->writable)
                return -EROFS;

        /* The kernel computes O_APPEND offsets from the size it keeps,
         * which is ours: this process is the sole writer. Holding no file
         * descriptor, we need not turn O_WRONLY into O_RDWR nor drop
         * O_APPEND: read always works, and write takes the offset given. */
        fi->keep_cache = srv->keep_cache;
        return 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
        Server *srv = server_of(req);
        int r;

        if (srv->no_open) {
                fuse_reply_err(req, ENOSYS); /* from now on the kernel opens on its own */
                return;
        }
        r = do_open(srv, ino, fi);
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_open(req, fi); /* nothing to release if it fails */
}

static int do_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                     struct fuse_file_info *fi, struct stat *ret) {
        Server *srv = server_of(req);
        int r;

        if (!srv->writable)
                return -EROFS;
        r = do_mknod(req, parent, name, S_IFREG | (mode & 07777), 0, ret);
        if (r < 0)
                return r;
        r = do_open(srv, ret->st_ino, fi);
        if (r < 0)
                return r;
        return lookup_ref(srv, ret->st_ino); /* counted last: nothing can fail after it */
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) {
        Server *srv = server_of(req);
        struct fuse_entry_param e;
        struct stat st;
        int r;

        r = do_create(req, parent, name, mode, fi, &st);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        entry_fill(srv, &st, &e);
        if (fuse_reply_create(req, &e, fi) < 0)
                lookup_unref(srv, st.st_ino, 1);
}

static ssize_t do_read(Server *srv, fuse_ino_t ino, size_t size, off_t off, char **ret) {
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        if (off < 0)
                return -EINVAL;
        buf = malloc(MAX(size, (size_t) 1));
        if (!buf)
                return -ENOMEM;
        n = volume_read(srv->volume, ino, buf, size, (uint64_t) off);
        if (n >= 0)
                *ret = TAKE_PTR(buf);
        return n;
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        n = do_read(server_of(req), ino, size, off, &buf);
        if (n < 0)
                fuse_reply_err(req, (int) -n);
        else
                fuse_reply_buf(req, buf, (size_t) n);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
        ssize_t n;

        /* O_APPEND is the kernel's: off is already the end of the file. */
        if (off < 0)
                n = -EINVAL;
        else
                n = volume_write(server_of(req)->volume, ino, buf, size, (uint64_t) off);
        if (n < 0)
                fuse_reply_err(req, (int) -n);
        else
                fuse_reply_write(req, (size_t) n);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
        fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
        reply_status(req, volume_fsync(server_of(req)->volume, ino));
}

static int do_fallocate(Server *srv, fuse_ino_t ino, int mode, off_t offset, off_t length) {
        if (offset < 0 || length <= 0)
                return -EINVAL;
        return volume_fallocate(srv->volume, ino, mode, (uint64_t) offset, (uint64_t) length);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                         struct fuse_file_info *fi) {
        reply_status(req, do_fallocate(server_of(req), ino, mode, offset, length));
}

/* SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself):
 * the store knows which blocks of a file hold data, so that cp and tar
 * keep a sparse file sparse. */
static int do_lseek(Server *srv, fuse_ino_t ino, off_t off, int whence, off_t *ret) {
        _cleanup_free_ VolumeExtent *extents = NULL;
        struct stat st;
        size_t n = 0;
        uint64_t pos;
        int r;

        if (whence != SEEK_DATA && whence != SEEK_HOLE)
                return -EINVAL;
        r = volume_getattr(srv->volume, ino, &st);
        if (r < 0)
                return r;
        if (off < 0 || off >= st.st_size)
                return -ENXIO;
        r = volume_file_extents(srv->volume, ino, &extents, &n);
        if (r == -ENODATA) {            /* inline: all data */
                *ret = whence == SEEK_DATA ? off : st.st_size;
                return 0;
        }
        if (r < 0)
                return r;
        pos = (uint64_t) off;
        for (size_t i = 0; i < n; i++) {
                uint64_t end = extents[i].offset + extents[i].length;

                if (end <= pos)
                        continue;
                if (whence == SEEK_DATA) {
                        *ret = (off_t) MAX(pos, extents[i].offset);
                        return 0;
                }
                if (extents[i].offset > pos)
                        break;          /* pos is in a hole */
                pos = end;
        }
        if (whence == SEEK_DATA)
                return -ENXIO;
        /* The end of the file counts as a hole. */
        *ret = (off_t) MIN(pos, (uint64_t) st.st_size);
        return 0;
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi) {
        off_t result = 0;
        int r = do_lseek(server_of(req), ino, off, whence, &result);

        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_lseek(req, result);
}

/* At most this much a call: the reply counts bytes in 32 bits, and the
 * caller asks again for the rest. */
#define COPY_RANGE_MAX (1024u * 1024 * 1024)

/* copy_file_range() within the mount shares the source's whole blocks
 * instead of copying them: cp of a large file costs its metadata. */
static ssize_t do_copy_file_range(Server *srv, fuse_ino_t ino_in, off_t off_in, fuse_ino_t ino_out,
                                  off_t off_out, size_t len, int flags) {
        struct stat st;
        uint64_t n;
        int r;

        if (flags != 0 || off_in < 0 || off_out < 0)
                return -EINVAL;
        r = volume_getattr(srv->volume, ino_in, &st);
        if (r < 0)
                return r;
        if (!S_ISREG(st.st_mode))
                return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        if (off_in >= st.st_size)
                return 0;
        n = MIN(MIN((uint64_t) len, (uint64_t) (st.st_size - off_in)), (uint64_t) COPY_RANGE_MAX);
        r = volume_clone_range(srv->volume, ino_out, (uint64_t) off_out, srv->volume, ino_in, (uint64_t) off_in, n);
        return r < 0 ? r : (ssize_t) n;
}

static void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
                               fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len,
                               int flags) {
        ssize_t n = do_copy_file_range(server_of(req), ino_in, off_in, ino_out, off_out, len, flags);

        if (n < 0)
                fuse_reply_err(req, (int) -n);
        else
                fuse_reply_write(req, (size_t) n);
}

/* ---- directories ---- */

static VolumeDir *dir_of(const struct fuse_file_info *fi) {
        return (VolumeDir *) (uintptr_t) fi->fh;
}

static int do_opendir(Server *srv, fuse_ino_t ino, struct fuse_file_info *fi) {
        VolumeDir *d;
        int r;

        r = volume_opendir(srv->volume, ino, &d);
        if (r < 0)
                return r;
        fi->fh = (uint64_t) (uintptr_t) d;
        fi->cache_readdir = srv->cache_readdir;
        fi->keep_cache = srv->cache_readdir;
        return 0;
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
        Server *srv = server_of(req);
        int r;

        if (srv->no_opendir) {
                fuse_reply_err(req, ENOSYS); /* from now on the kernel opens on its own */
                return;
        }
        r = do_opendir(srv, ino, fi);
        if (r < 0)
                fuse_reply_err(req, -r);
        else if (fuse_reply_open(req, fi) < 0)
                volume_dir_free(dir_of(fi)); /* the kernel will not release what it never got */
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
        volume_dir_free(dir_of(fi));
        fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
        reply_status(req, volume_sync(server_of(req)->volume));
}

/* A listing is [".", "..", entries...]: "." has the offset 1, ".." 2, an
 * entry its cookie; a reply goes on after the offset it is given. */
typedef struct DirEntryView {
        const char *name;
        uint64_t ino;
        mode_t type;
        off_t next;
} DirEntryView;

static DirEntryView dir_entry_at(const VolumeDir *d, size_t i) {
        if (i < 2)
                return (DirEntryView) { i == 0 ? "." : "..", i == 0 ? d->ino : d->parent, S_IFDIR, (off_t) i + 1 };
        return (DirEntryView) { d->entries[i - 2].name, d->entries[i - 2].ino, d->entries[i - 2].type,
                                d->entries[i - 2].cookie };
}

/* The index in [".", "..", entries...] of the first entry after offset off. */
static size_t dir_index_after(const VolumeDir *d, off_t off) {
        size_t lo = 0, hi = d->n;

        if (off < VOLUME_DIR_FIRST_COOKIE)
                return (size_t) off;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (d->entries[mid].cookie <= off)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo + 2;
}

/* One reply's buffer, and for readdirplus the inodes whose lookups it counts. */
typedef struct DirReply {
        char *buf;
        size_t size;
        size_t len;
        uint64_t *counted;
        size_t n_counted;
        size_t max_counted;
} DirReply;

static void dir_reply_done(DirReply *r) {
        free(r->buf);
        free(r->counted);
}

/* Returns 1 if the entry was added, 0 if it does not fit. */
static int dir_add(fuse_req_t req, DirReply *r, const DirEntryView *ent) {
        struct stat st = { .st_ino = ent->ino, .st_mode = ent->type };
        size_t room = r->size - r->len, len;

        len = fuse_add_direntry(req, r->buf + r->len, room, ent->name, &st, ent->next);
        if (len > room)
                return 0;
        r->len += len;
        return 1;
}

/* Adds an entry with its attributes and counts its lookup ("." and ".."
 * go without: the kernel does not link them). A name gone since opendir
 * is listed without attributes (ino 0), as plain readdir would list it.
 * Returns 1 if added, 0 if it does not fit, or a negative errno. */
static int dir_add_plus(fuse_req_t req, Server *srv, DirReply *r, const VolumeDir *d, const DirEntryView *ent) {
        struct fuse_entry_param e = { .attr = { .st_ino = ent->ino, .st_mode = ent->type } };
        size_t room = r->size - r->len, len;
        struct stat st;
        int k;

        if (!streq_dot(ent->name)) {
                k = volume_lookup(srv->volume, d->ino, ent->name, &st);
                if (k >= 0)
                        entry_fill(srv, &st, &e);
                else if (k != -ENOENT)
                        return k;
        }
        len = fuse_add_direntry_plus(req, r->buf + r->len, room, ent->name, &e, ent->next);
        if (len > room || (e.ino != 0 && r->n_counted >= r->max_counted))
                return 0;
        if (e.ino != 0) {
                k = lookup_ref(srv, e.ino);
                if (k < 0)
                        return k;
                r->counted[r->n_counted++] = e.ino;
        }
        r->len += len;
        return 1;
}

static int dir_reply_alloc(fuse_req_t req, DirReply *r, size_t size, bool plus) {
        r->size = size;
        r->buf = malloc(MAX(size, (size_t) 1));
        if (!r->buf)
                return -ENOMEM;
        if (plus) {
                /* No entry is smaller than one with an empty name. */
                struct fuse_entry_param e = {};
                size_t smallest = fuse_add_direntry_plus(req, NULL, 0, "", &e, 0);

                r->max_counted = size / MAX(smallest, (size_t) 1) + 1;
                r->counted = calloc(r->max_counted, sizeof *r->counted);
                if (!r->counted)
                        return -ENOMEM;
        }
        return 0;
}

/* Fills the reply from offset off. An error after the first entry ends the
 * reply early: the next call meets it again, with nothing sent. */
static int do_readdir(fuse_req_t req, Server *srv, const VolumeDir *d, size_t size, off_t off, bool plus,
                      DirReply *ret) {
        int r;

        if (off < 0)
                return -EINVAL;
        r = dir_reply_alloc(req, ret, size, plus);
        if (r < 0)
                return r;

        for (size_t i = dir_index_after(d, off); i < d->n + 2; i++) {
                DirEntryView ent = dir_entry_at(d, i);

                if (plus)
                        r = dir_add_plus(req, srv, ret, d, &ent);
                else
                        r = dir_add(req, ret, &ent);
                if (r < 0 && ret->len == 0)
                        return r;
                if (r <= 0)
                        break;
        }
        return 0;
}

static void listing_drop(ListingSlot *slot) {
        slot->dir = volume_dir_free(slot->dir);
        slot->last_used = 0;
}

/* The listing of a directory read without opendir: a new one at offset 0,
 * else the one being read if it is still kept. */
static int listing_get(Server *srv, fuse_ino_t ino, off_t off, ListingSlot **ret) {
        Listings *l = &srv->listings;
        ListingSlot *slot = NULL;
        int r;

        for (size_t i = 0; i < LISTING_SLOTS; i++) {
                ListingSlot *s = &l->slots[i];

                if (s->dir && s->dir->ino == ino) {
                        slot = s;
                        break;
                }
                if (!slot || s->last_used < slot->last_used)
                        slot = s; /* an empty one, else the least recently used */
        }
        if (!slot->dir || slot->dir->ino != ino || off == 0) {
                listing_drop(slot);
                r = volume_opendir(srv->volume, ino, &slot->dir);
                if (r < 0)
                        return r;
        }
        slot->last_used = ++l->clock;
        *ret = slot;
        return 0;
}

static int readdir_listed(fuse_req_t req, Server *srv, fuse_ino_t ino, size_t size, off_t off, bool plus,
                          DirReply *ret) {
        Listings *l = &srv->listings;
        ListingSlot *slot;
        int r;

        MUTEX_LOCKED(&l->lock);
        r = listing_get(srv, ino, off, &slot);
        if (r < 0)
                return r;
        r = do_readdir(req, srv, slot->dir, size, off, plus, ret);
        if (r >= 0 && ret->len == 0)
                listing_drop(slot); /* read to its end */
        return r;
}

static void listings_done(Listings *l) {
        for (size_t i = 0; i < LISTING_SLOTS; i++)
                listing_drop(&l->slots[i]);
        pthread_mutex_destroy(&l->lock);
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi,
                           bool plus) {
        _cleanup_(dir_reply_done) DirReply reply = {};
        Server *srv = server_of(req);
        int r;

        if (dir_of(fi))
                r = do_readdir(req, srv, dir_of(fi), size, off, plus, &reply);
        else
                r = readdir_listed(req, srv, ino, size, off, plus, &reply);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        if (fuse_reply_buf(req, reply.buf, reply.len) < 0)
                for (size_t i = 0; i < reply.n_counted; i++)
                        lookup_unref(srv, reply.counted[i], 1);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
        readdir_common(req, ino, size, off, fi, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi) {
        readdir_common(req, ino, size, off, fi, true);
}

/* ---- extended attributes ---- */

/* The namespaces a program may set, as on ext4: user, trusted and
 * security, each with a name after its prefix. Others (system: ACLs are
 * off; and none at all) are not supported. An image's received xattrs
 * (btrfs.*) are the stream's, not set through here. */
static int xattr_name_settable(const char *name) {
        FOREACH_STRING(prefix, "user.", "trusted.", "security.")
                if (startswith(name, prefix))
                        return name[strlen(prefix)] ? 0 : -EINVAL;
        return -EOPNOTSUPP;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
                        int flags) {
        int r = xattr_name_settable(name);

        reply_status(req, r < 0 ? r : volume_setxattr(server_of(req)->volume, ino, name, value, size, flags));
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) {
        reply_status(req, volume_removexattr(server_of(req)->volume, ino, name));
}

/* size 0 asks for the length; otherwise the value, in a buffer of size. */
static ssize_t do_getxattr(Server *srv, fuse_ino_t ino, const char *name, size_t size, char **ret) {
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        if (size > 0) {
                buf = malloc(size);
                if (!buf)
                        return -ENOMEM;
        }
        n = volume_getxattr(srv->volume, ino, name, buf, size);
        if (n >= 0)
                *ret = TAKE_PTR(buf);
        return n;
}

static void reply_xattr(fuse_req_t req, size_t size, const char *buf, ssize_t n) {
        if (n < 0)
                fuse_reply_err(req, (int) -n);
        else if (size == 0)
                fuse_reply_xattr(req, (size_t) n);
        else
                fuse_reply_buf(req, buf, (size_t) n);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        n = do_getxattr(server_of(req), ino, name, size, &buf);
        reply_xattr(req, size, buf, n);
}

/* The names a mount shows: not those of POSIX ACLs, which it keeps but
 * the kernel refuses to read without FUSE's ACL support (a copy of the
 * tree would fail on each). */
static ssize_t list_shown_xattrs(Server *srv, fuse_ino_t ino, char **ret) {
        for (;;) {
                _cleanup_free_ char *buf = NULL;
                ssize_t n, kept = 0;

                n = volume_listxattr(srv->volume, ino, NULL, 0);
                if (n <= 0)
                        return n;
                buf = malloc((size_t) n);
                if (!buf)
                        return -ENOMEM;
                n = volume_listxattr(srv->volume, ino, buf, (size_t) n);
                if (n == -ERANGE)
                        continue;       /* one more name meanwhile */
                if (n < 0)
                        return n;
                for (ssize_t i = 0; i < n;) {
                        size_t len = strnlen(buf + i, (size_t) (n - i)) + 1;

                        if (!xattr_name_is_acl(buf + i)) {
                                memmove(buf + kept, buf + i, len);
                                kept += (ssize_t) len;
                        }
                        i += (ssize_t) len;
                }
                *ret = TAKE_PTR(buf);
                return kept;
        }
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        n = list_shown_xattrs(server_of(req), ino, &buf);
        if (n >= 0 && size > 0 && (size_t) n > size)
                n = -ERANGE;
        reply_xattr(req, size, buf, n);
}

static const struct fuse_lowlevel_ops cowbox_fuse_ops = {
        .init = op_init,
        .lookup = op_lookup,
        .forget = op_forget,
        .forget_multi = op_forget_multi,
        .getattr = op_getattr,
        .setattr = op_setattr,
        .readlink = op_readlink,
        .mknod = op_mknod,
        .mkdir = op_mkdir,
        .unlink = op_unlink,
        .rmdir = op_rmdir,
        .symlink = op_symlink,
        .rename = op_rename,
        .link = op_link,
        .open = op_open,
        .read = op_read,
        .write = op_write,
        .release = op_release,
        .fsync = op_fsync,
        .opendir = op_opendir,
        .readdir = op_readdir,
        .readdirplus = op_readdirplus,
        .releasedir = op_releasedir,
        .fsyncdir = op_fsyncdir,
        .statfs = op_statfs,
        .setxattr = op_setxattr,
        .getxattr = op_getxattr,
        .listxattr = op_listxattr,
        .removexattr = op_removexattr,
        .create = op_create,
        .fallocate = op_fallocate,
        .lseek = op_lseek,
        .copy_file_range = op_copy_file_range,
};

/* ---- mounting ---- */

/* Opens the volume writable unless asked not to or the subvolume is
 * read-only, and fixes the cache settings that follow from it. */
static int server_open(Server *srv, Store *s, const char *name, bool readonly, pid_t *ret_holder) {
        bool sole;
        int r = -EROFS;

        if (!readonly)
                r = volume_open(s, name, true, &srv->volume, ret_holder);
        if (r == -EROFS)
                r = volume_open(s, name, false, &srv->volume, ret_holder);
        if (r < 0)
                return r;

        sole = volume_is_sole_writer(srv->volume);
        srv->writable = volume_is_writable(srv->volume);
        srv->entry_timeout = srv->attr_timeout = sole ? CACHE_TIMEOUT_SOLE_WRITER : CACHE_TIMEOUT_SHARED;
        srv->negative_timeout = sole ? CACHE_TIMEOUT_SOLE_WRITER : 0;
        srv->keep_cache = sole;
        srv->cache_readdir = sole;
        return 0;
}

/* Before a snapshot another process asked for: the dirty pages of shared
 * mappings come to us as writes. The mount's root is opened by path, so
 * it must still be ours: a FUSE file system whose root has our root's
 * inode number. The descriptor is not kept, or unmounting would fail. A
 * mount we cannot reach any more (moved, covered, detached) is not held
 * against the snapshot, which then gets what reached us so far; a failed
 * writeback is. */
static int server_write_back(void *userdata) {
        Server *srv = userdata;
        _cleanup_close_ int fd = -EBADF;
        struct statfs sfs;
        struct stat st;

        fd = open(srv->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || fstatfs(fd, &sfs) < 0 || fstat(fd, &st) < 0)
                return 0;
        if (sfs.f_type != FUSE_SUPER_MAGIC || st.st_ino != VOLUME_ROOT_INO)
                return 0;
        if (syncfs(fd) < 0)
                return -errno;
        return 0;
}

/* Runs after the session is gone: the kernel's remaining lookups die with
 * the mount, and volume_close() purges what they kept alive. */
static void server_done(Server *srv) {
        srv->volume = volume_close(srv->volume);
        free(srv->inodes.slots);
        pthread_mutex_destroy(&srv->inodes.lock);
        listings_done(&srv->listings);
}

static int mount_args(struct fuse_args *args, const char *name, bool readonly, bool debug) {
        char escaped[2 * STORE_NAME_MAX + 1], *p = escaped;
        _cleanup_free_ char *options = NULL;

        /* fuse_opt splits options at commas: escape them, and the escape. */
        for (const char *c = name; *c && p < escaped + sizeof escaped - 2; c++) {
                if (*c == ',' || *c == '\\')
                        *p++ = '\\';
                *p++ = *c;
        }
        *p = 0;

        /* noatime: reads never change a file's atime, and the mount says
         * so to those who ask (statfs, mountinfo). */
        if (asprintf(&options, "fsname=cowbox:%s,subtype=cowbox,default_permissions,allow_other,noatime%s",
                     escaped, readonly ? ",ro" : "") < 0)
                return -ENOMEM;
        if (fuse_opt_add_arg(args, "cowbox") < 0 || fuse_opt_add_arg(args, "-o") < 0 ||
            fuse_opt_add_arg(args, options) < 0 || (debug && fuse_opt_add_arg(args, "-d") < 0))
                return -ENOMEM;
        return 0;
}

static int loop_write(int fd, const void *buf, size_t size) {
        const char *p = buf;

        while (size > 0) {
                ssize_t n = write(fd, p, size);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                p += n;
                size -= (size_t) n;
        }
        return 0;
}

/* Leaves the caller's session, working directory and terminal, as
 * fuse_daemonize() does; what the server has to say from then on goes to
 * the store's log. */
static void detach(Store *s) {
        int fd;

        (void) setsid();
        if (chdir("/") < 0) {
                /* stays where it is, ignoring */
        }
        fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return;
        (void) dup2(fd, STDIN_FILENO);
        (void) dup2(fd, STDOUT_FILENO);
        if (store_log_to_file(s) < 0)
                (void) dup2(fd, STDERR_FILENO);
        if (fd > STDERR_FILENO)
                safe_close(fd);
}

/* The mount is up: leave the caller's session if asked to, then tell
 * whoever waits for it, so that the server is on its own by the time the
 * caller goes on. Write errors are ignored (the reader may be gone; SIGPIPE
 * is ignored by now). */
static void mount_ready(Store *s, const StoreMountOptions *opts) {
        if (opts->detach)
                detach(s);
        if (opts->ready_fd >= 0) {
                (void) loop_write(opts->ready_fd, "1\n", 2);
                safe_close(opts->ready_fd);
        }
}

/* One thread per CPU: more only contend for /dev/fuse (copying 9,000
 * small files in took 5 s with 2 threads and 8 to 14 s with 8, on 2 CPUs). */
static unsigned default_threads(void) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);

        return (unsigned) MIN(MAX(n, 2L), (long) MAX_THREADS_DEFAULT);
}

/* The kernel starts a FUSE mount's read-ahead at its 128 KiB default, which
 * INIT can only lower: the mount's backing device in sysfs raises it. Large
 * files are then read as several READs at once, and several threads
 * decompress their blocks in parallel (1.4 times as fast here). Root only;
 * elsewhere the default stays. Nobody serves the mount yet: the statx must
 * not ask us, and with AT_STATX_DONT_SYNC it does not. */
static void raise_read_ahead(const char *mountpoint) {
        _cleanup_close_ int fd = -EBADF;
        struct statx stx;
        char path[64];

        if (statx(AT_FDCWD, mountpoint, AT_STATX_DONT_SYNC | AT_NO_AUTOMOUNT, STATX_TYPE, &stx) < 0)
                return;
        snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", stx.stx_dev_major, stx.stx_dev_minor);
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd >= 0)
                (void) dprintf(fd, "%u\n", READ_AHEAD_BYTES / 1024);
}

/* Mounts at mount_at (mountpoint, or a name of the same directory) and
 * serves until unmounted or told to stop. libfuse's own failures say no
 * more than that they failed: -EIO. */
static int serve(Store *s, const char *name, const char *mountpoint, const char *mount_at,
                 const StoreMountOptions *opts, pid_t *ret_holder) {
        _cleanup_(server_done) Server srv = {
                .inodes.lock = PTHREAD_MUTEX_INITIALIZER,
                .listings.lock = PTHREAD_MUTEX_INITIALIZER,
        };
        _cleanup_(fuse_opt_free_args) struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
        struct fuse_session *se;
        int r;

        r = server_open(&srv, s, name, opts->readonly, ret_holder);
        if (r < 0)
                return r;
        srv.map_root = opts->map_root;
        srv.root_uid = opts->root_uid;
        srv.root_gid = opts->root_gid;
        r = mount_args(&args, name, !srv.writable, opts->debug);
        if (r < 0)
                return r;

        se = fuse_session_new(&args, &cowbox_fuse_ops, sizeof cowbox_fuse_ops, &srv);
        if (!se)
                return -EIO;
        if (fuse_set_signal_handlers(se) < 0) {
                r = -EIO;
                goto destroy;
        }
        if (fuse_session_mount(se, mount_at) < 0) {
                r = -EIO;
                goto remove_handlers;
        }

        srv.mountpoint = mountpoint;
        raise_read_ahead(mountpoint);
        if (srv.writable) {
                volume_set_write_back(srv.volume, server_write_back, &srv);
                volume_set_before_wait(srv.volume, session_hand_off);
        }
        mount_ready(s, opts);
        r = session_serve(se, opts->max_threads > 0 ? opts->max_threads : default_threads());
        /* A mount straight after this unmount waits for our last commit. */
        volume_closing(srv.volume);
        volume_set_write_back(srv.volume, NULL, NULL);
        volume_set_before_wait(srv.volume, NULL);

        fuse_session_unmount(se);
        /* The last commit, while libfuse's handlers still catch SIGTERM
         * and SIGINT: an unmount is a clean stop, and a signal sent to
         * hurry it along must not kill it half way. */
        srv.volume = volume_close(srv.volume);
remove_handlers:
        fuse_remove_signal_handlers(se);
destroy:
        fuse_session_destroy(se);
        return r;
}

/* ready_fd is closed once mounted, and left to the caller if the mount
 * fails. */
int store_mount(Store *s, const char *name, const char *mountpoint,
                const StoreMountOptions *opts, pid_t *ret_holder) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        char via_fd[64];

        if (!s || !opts || !mountpoint || !name || !store_name_is_valid(name))
                return -EINVAL;
        if (ret_holder)
                *ret_holder = 0;
        /* The server opens its mount again before each snapshot, when a
         * background server has long left the caller's directory. */
        if (opts->nofollow)
                path = mountpoint[0] == '/' ? strdup(mountpoint) : NULL;
        else
                path = realpath(mountpoint, NULL);
        if (!path)
                return opts->nofollow && mountpoint[0] != '/' ? -EINVAL : -errno;

        /* The mount goes on the directory opened here, through its
         * descriptor: a symbolic link swapped in after this cannot move it
         * elsewhere (mount(2) of a path would follow it). Only root mounts
         * itself; fusermount3, which mounts for others, checks the path on
         * its own. The descriptor stays open while we serve: libfuse
         * unmounts through the same name when told to stop. */
        fd = open_dir_nofollow(path);
        if (fd < 0)
                return fd;
        snprintf(via_fd, sizeof via_fd, "/proc/self/fd/%d", fd);

        return serve(s, name, path, geteuid() == 0 ? via_fd : path, opts, ret_holder);
}
