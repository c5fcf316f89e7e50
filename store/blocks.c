/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Data blocks: addressed by their keyed XXH3-128 digest, compressed with
 * zstd when that saves space, appended to pack files, indexed in the
 * catalog. Each writing process appends to a pack of its own (held with an
 * exclusive flock), so writers never contend for a pack.
 *
 * Durability order at commit: the pack is fdatasync'd before its blocks
 * are indexed, and blocks are indexed before a layer that references them
 * commits. A crash at any point leaves at most unreferenced records, which
 * the reaper frees.
 *
 * Records are written with direct I/O: gathered in a buffer and written in
 * whole 4 KiB pages by the writing process itself, so that the cgroup the
 * FUSE server runs in is charged for them (cgroup v1 charges the page
 * cache's writeback to no one) and the page cache holds no second copy.
 * Records stay packed: the last, partial page stays in the buffer and is
 * written again, with the same bytes in front, when more records follow.
 * Blocks still in the buffer are read from it.
 */

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <zstd.h>

#include "alloc-util.h"
#include "env-util.h"
#include "fd-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "xxhash-util.h"

#define PACK_MAX_BYTES (1024ull * 1024 * 1024)
/* Tests make packs small to make many of them: $COWBOX_PACK_MAX_BYTES. */
#define PACK_MAX_BYTES_MIN (256ull * 1024)
#define PACK_FD_CACHE 64
#define READ_CACHE_SLOTS 64
/* Direct I/O writes whole pages of this size, from memory aligned to it. */
#define PACK_PAGE 4096u
#define STAGE_BYTES (2u * 1024 * 1024)
/* Blocks are compressed by up to this many threads at once, each taking at
 * least this many. */
#define ENCODER_THREADS 4
#define ENCODER_MIN_BLOCKS 8

/* Where blocks that were read lie: reads then skip the index. Never used
 * to decide that a block exists (dedup asks the index, under the GC lock):
 * another process's reaper may have freed it since. A stale location only
 * makes a read fail its checks, and the read then asks the index. */
#define LOCATION_SLOTS 16384
typedef struct KnownLocation {
        Digest digest;
        BlockLocation loc;
        bool valid;
} KnownLocation;

typedef struct PendingBlock {
        Digest digest;
        BlockLocation loc;
} PendingBlock;

typedef struct CachedBlock {
        bool valid;
        Digest digest;
        uint32_t len;
        uint8_t *data;
} CachedBlock;

typedef struct PackFd {
        uint64_t id;
        int fd;
} PackFd;

struct Packs {
        pthread_mutex_t lock;

        /* The pack this process appends to, and the size at which it moves
         * on to a new one. */
        int writer_fd;
        uint64_t pack_max_bytes;
        /* Full packs whose last blocks are not indexed yet: they stay locked
         * until they are, or the reaper would take those blocks for a dead
         * writer's leftovers. */
        int retired_fds[4];
        uint64_t writer_id;
        uint64_t writer_end;
        bool writer_unsynced;
        uint64_t synced_end;    /* the writer's pack is durable up to here */
        /* A sync of the writer's pack failed: what was appended since the
         * last that worked may be lost, though a sync tried again would
         * succeed (the kernel forgets a writeback error once reported). No
         * block of it may be indexed: every commit fails from then on. */
        int failed;

        /* Records not written yet: stage[0] is at pack offset stage_base (a
         * page boundary), writer_end is stage_base + stage_len, and the
         * first stage_written bytes are on disk already. */
        uint8_t *stage;
        uint64_t stage_base;
        size_t stage_len;
        size_t stage_written;

        /* Blocks appended but not indexed yet. */
        PendingBlock *pending;
        size_t n_pending, allocated_pending;

        PackFd fds[PACK_FD_CACHE];
        unsigned next_fd_slot;

        CachedBlock cache[READ_CACHE_SLOTS];
        KnownLocation *locations;       /* LOCATION_SLOTS, allocated on first use */

        ZSTD_CCtx *cctx;
        uint8_t *scratch;       /* a record being written */
};

void digest_to_hex(const Digest *d, char ret[static 33]) {
        for (size_t i = 0; i < sizeof d->bytes; i++)
                snprintf(ret + 2 * i, 3, "%02x", d->bytes[i]);
}

static size_t record_max(void) {
        return sizeof(PackRecordHeader) + ZSTD_compressBound(STORE_BLOCK_SIZE);
}

static uint64_t pack_max_bytes(void) {
        uint64_t n;

        if (secure_getenv_uint64("COWBOX_PACK_MAX_BYTES", &n) < 0 || n == 0)
                return PACK_MAX_BYTES;
        return MIN(MAX(n, PACK_MAX_BYTES_MIN), PACK_MAX_BYTES);
}

/* Fault injection for tests (COWBOX_FAULT_PACK_IO=N): the Nth write or
 * sync of a pack in this process fails with EIO. A sync that fails
 * leaves zeros where it should have made records durable, what a disk that
 * lost its write cache holds once the power went. */
static uint64_t pack_faults_left;

static void pack_fault_configure(void) {
        (void) secure_getenv_uint64("COWBOX_FAULT_PACK_IO", &pack_faults_left);
}

static bool pack_fault(void) {
        uint64_t left = __atomic_load_n(&pack_faults_left, __ATOMIC_RELAXED);

        while (left > 0)
                if (__atomic_compare_exchange_n(&pack_faults_left, &left, left - 1, false, __ATOMIC_RELAXED,
                                                __ATOMIC_RELAXED))
                        return left == 1;
        return false;
}

int packs_new(Store *s, struct Packs **ret) {
        static pthread_once_t configured = PTHREAD_ONCE_INIT;
        struct Packs *p;

        (void) pthread_once(&configured, pack_fault_configure);

        p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        pthread_mutex_init(&p->lock, NULL);
        p->writer_fd = -EBADF;
        p->pack_max_bytes = pack_max_bytes();
        for (size_t i = 0; i < ELEMENTSOF(p->retired_fds); i++)
                p->retired_fds[i] = -EBADF;
        for (size_t i = 0; i < PACK_FD_CACHE; i++)
                p->fds[i].fd = -EBADF;
        p->cctx = ZSTD_createCCtx();
        p->scratch = malloc(record_max());
        if (posix_memalign((void **) &p->stage, PACK_PAGE, STAGE_BYTES + PACK_PAGE) != 0)
                p->stage = NULL;
        if (!p->cctx || !p->scratch || !p->stage) {
                packs_free(p);
                return -ENOMEM;
        }
        (void) ZSTD_CCtx_setParameter(p->cctx, ZSTD_c_compressionLevel, STORE_ZSTD_LEVEL);
        *ret = p;
        return 0;
}

static void packs_release_retired(struct Packs *p) {
        for (size_t i = 0; i < ELEMENTSOF(p->retired_fds); i++)
                p->retired_fds[i] = safe_close(p->retired_fds[i]);
}

static int packs_retired_slot(struct Packs *p) {
        for (size_t i = 0; i < ELEMENTSOF(p->retired_fds); i++)
                if (p->retired_fds[i] < 0)
                        return (int) i;
        return -EBUSY; /* commit first: the block stays dirty until then */
}

struct Packs *packs_free(struct Packs *p) {
        if (!p)
                return NULL;
        safe_close(p->writer_fd);
        packs_release_retired(p);
        for (size_t i = 0; i < PACK_FD_CACHE; i++)
                safe_close(p->fds[i].fd);
        for (size_t i = 0; i < READ_CACHE_SLOTS; i++)
                free(p->cache[i].data);
        free(p->locations);
        free(p->pending);
        ZSTD_freeCCtx(p->cctx);
        free(p->scratch);
        free(p->stage);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
}

uint64_t inline_check(const void *stored, size_t len) {
        return XXH3_64bits(len > 0 ? stored : "", len);
}

void block_digest(Store *s, const void *data, size_t len, Digest *ret) {
        XXH128_canonical_t c;

        XXH128_canonicalFromHash(&c, XXH3_128bits_withSecret(data, len, s->secret, sizeof s->secret));
        memcpy(ret->bytes, c.digest, sizeof ret->bytes);
}

static PendingBlock *pending_find(struct Packs *p, const Digest *d) {
        /* Scanned newest first: the batch is bounded by the commit interval. */
        for (size_t i = p->n_pending; i > 0; i--)
                if (memcmp(p->pending[i - 1].digest.bytes, d->bytes, sizeof d->bytes) == 0)
                        return &p->pending[i - 1];
        return NULL;
}

static int index_lookup(Store *s, const Digest *d, BlockLocation *ret, bool *ret_damaged) {
        sqlite3_stmt *st;
        int r;

        CATALOG_LOCKED(s);
        if (!s->find_block) {
                r = sqlite_prepare(s->catalog, "SELECT pack, offset, stored_len, raw_len, "
                                   "EXISTS (SELECT 1 FROM damaged_blocks WHERE digest = ?1) "
                                   "FROM blocks WHERE digest = ?1", &s->find_block);
                if (r < 0)
                        return r;
        }
        st = s->find_block;
        sqlite3_bind_blob(st, 1, d->bytes, sizeof d->bytes, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r > 0) {
                *ret = (BlockLocation) {
                        .pack = (uint64_t) sqlite3_column_int64(st, 0),
                        .offset = (uint64_t) sqlite3_column_int64(st, 1),
                        .stored_len = (uint32_t) sqlite3_column_int(st, 2),
                        .raw_len = (uint32_t) sqlite3_column_int(st, 3),
                };
                if (ret_damaged)
                        *ret_damaged = sqlite3_column_int(st, 4) != 0;
        }
        sqlite3_reset(st);
        if (r < 0)
                return r;
        return r > 0 ? 0 : -ENOENT;
}

static int lookup(Store *s, const Digest *d, BlockLocation *ret, bool *ret_damaged) {
        struct Packs *p = s->packs;

        {
                MUTEX_LOCKED(&p->lock);
                PendingBlock *pb = pending_find(p, d);
                if (pb) {
                        *ret = pb->loc;
                        return 0;
                }
        }
        return index_lookup(s, d, ret, ret_damaged);
}

int block_lookup(Store *s, const Digest *d, BlockLocation *ret) {
        return lookup(s, d, ret, NULL);
}

/* Where a block to be put is stored already: -ENOENT if it is not, or if
 * its record was found damaged, so that the bytes are stored anew. */
static int lookup_for_put(Store *s, const Digest *d, BlockLocation *ret) {
        bool damaged = false;
        int r = lookup(s, d, ret, &damaged);

        return r >= 0 && damaged ? -ENOENT : r;
}

void block_mark_damaged(Store *s, const Digest *d) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;

        CATALOG_LOCKED(s);
        if (sqlite_prepare(s->catalog, "INSERT OR IGNORE INTO damaged_blocks(digest) VALUES (?1)", &st) < 0)
                return;
        sqlite3_bind_blob(st, 1, d->bytes, sizeof d->bytes, SQLITE_STATIC);
        (void) sqlite_step_done(st);
}

static KnownLocation *location_slot(struct Packs *p, const Digest *d) {
        uint32_t h;

        if (!p->locations) {
                p->locations = calloc(LOCATION_SLOTS, sizeof *p->locations);
                if (!p->locations)
                        return NULL;
        }
        memcpy(&h, d->bytes, sizeof h);
        return &p->locations[h % LOCATION_SLOTS];
}

int block_locate(Store *s, const Digest *d, BlockLocation *ret) {
        struct Packs *p = s->packs;
        int r;

        {
                MUTEX_LOCKED(&p->lock);
                PendingBlock *pb = pending_find(p, d);
                KnownLocation *k;

                if (pb) {
                        *ret = pb->loc;
                        return 0;
                }
                k = location_slot(p, d);
                if (k && k->valid && memcmp(k->digest.bytes, d->bytes, sizeof d->bytes) == 0) {
                        *ret = k->loc;
                        return 0;
                }
        }
        r = index_lookup(s, d, ret, NULL);
        if (r < 0)
                return r;

        MUTEX_LOCKED(&p->lock);
        KnownLocation *k = location_slot(p, d);
        if (k)
                *k = (KnownLocation) { .digest = *d, .loc = *ret, .valid = true };
        return 0;
}

void block_forget_location(Store *s, const Digest *d) {
        struct Packs *p = s->packs;

        MUTEX_LOCKED(&p->lock);
        KnownLocation *k = location_slot(p, d);
        if (k && k->valid && memcmp(k->digest.bytes, d->bytes, sizeof d->bytes) == 0)
                k->valid = false;
}

static void pack_file_name(uint64_t id, char ret[static 32]) {
        snprintf(ret, 32, "%" PRIu64 ".pack", id);
}

/* Registers a new pack in the catalog and creates it, locked for us. */
static int writer_open_new_pack(Store *s) {
        struct Packs *p = s->packs;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_close_ int fd = -EBADF;
        char name[32];
        uint64_t id;
        int r, slot = -1;

        if (p->writer_fd >= 0) {
                slot = packs_retired_slot(p);
                if (slot < 0)
                        return slot;
        }

        {
                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog, "INSERT INTO packs(created_usec) VALUES (?1)", &st);
                if (r < 0)
                        return r;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) now_usec());
                r = sqlite_step_done(st);
                if (r < 0)
                        return r;
                id = (uint64_t) sqlite3_last_insert_rowid(s->catalog);
        }

        pack_file_name(id, name);
        fd = openat(s->packs_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
        if (fd < 0 && errno == EINVAL) /* a file system without direct I/O */
                fd = openat(s->packs_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0)
                return -errno;
        if (pack_fault())
                return -EIO;
        if (fsync(s->packs_fd) < 0)
                return -errno;

        if (slot >= 0)
                p->retired_fds[slot] = TAKE_FD(p->writer_fd);
        p->writer_fd = TAKE_FD(fd);
        p->writer_id = id;
        p->writer_end = 0;
        p->synced_end = 0;
        p->stage_base = 0;
        p->stage_len = p->stage_written = 0;
        return 0;
}

/* Compresses when that saves at least 1/16 of the block. A short block is
 * a small file's, or a file's tail: the store's dictionary knows it best.
 * out has room for record_max() bytes. */
static size_t record_encode(Store *s, ZSTD_CCtx *cctx, uint8_t *out, const void *data, size_t len,
                            const Digest *d) {
        PackRecordHeader *h = (PackRecordHeader *) out;
        uint8_t *payload = out + sizeof *h;
        const ZSTD_CDict *cdict = len < STORE_BLOCK_SIZE ? dictionary_for_compression(s) : NULL;
        size_t stored;
        uint8_t compression = PACK_COMPRESSION_ZSTD;

        if (cdict)
                stored = ZSTD_compress_usingCDict(cctx, payload, ZSTD_compressBound(STORE_BLOCK_SIZE), data, len,
                                                  cdict);
        else
                stored = ZSTD_compress2(cctx, payload, ZSTD_compressBound(STORE_BLOCK_SIZE), data, len);
        if (ZSTD_isError(stored) || stored >= len - len / 16) {
                memcpy(payload, data, len);
                stored = len;
                compression = PACK_COMPRESSION_NONE;
        }

        *h = (PackRecordHeader) {
                .magic = PACK_RECORD_MAGIC,
                .version = 1,
                .compression = compression,
                .raw_len = (uint32_t) len,
                .stored_len = (uint32_t) stored,
                .payload_check = XXH3_64bits(payload, stored),
        };
        memcpy(h->digest, d->bytes, sizeof h->digest);
        h->header_check = XXH32(h, offsetof(PackRecordHeader, header_check), 0);
        return sizeof *h + stored;
}

static int pending_add(struct Packs *p, const Digest *d, const BlockLocation *loc) {
        if (!GREEDY_REALLOC(p->pending, p->allocated_pending, p->n_pending + 1))
                return -ENOMEM;
        p->pending[p->n_pending++] = (PendingBlock) { .digest = *d, .loc = *loc };
        return 0;
}

static ssize_t pwrite_direct(int fd, const void *buf, size_t len, uint64_t offset) {
        ssize_t k;

        if (pack_fault())
                return -EIO;
        k = pwrite(fd, buf, len, (off_t) offset);

        if (k < 0 && errno == EINVAL && (fcntl(fd, F_GETFL) & O_DIRECT)) {
                /* A device whose blocks are larger than our pages. */
                if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) < 0)
                        return -errno;
                k = pwrite(fd, buf, len, (off_t) offset);
        }
        return k < 0 ? -errno : k;
}

/* Writes the buffer's whole pages, and if partial also its last page,
 * padded with zeros; then keeps only the bytes of the last partial page.
 * On failure (-ENOSPC for a short write) everything stays in the buffer. */
static int stage_write(struct Packs *p, bool partial) {
        size_t full = p->stage_len / PACK_PAGE * PACK_PAGE;
        size_t len = partial ? DIV_ROUND_UP(p->stage_len, PACK_PAGE) * PACK_PAGE : full;
        size_t done = 0;

        if (len == 0 || (partial && p->stage_written == p->stage_len))
                return 0;
        if (len > p->stage_len)
                memset(p->stage + p->stage_len, 0, len - p->stage_len);
        while (done < len) {
                ssize_t k = pwrite_direct(p->writer_fd, p->stage + done, len - done, p->stage_base + done);
                if (k < 0)
                        return (int) k;
                if (k == 0 || (k % PACK_PAGE) != 0)
                        return -ENOSPC;
                done += (size_t) k;
        }
        memmove(p->stage, p->stage + full, p->stage_len - full);
        p->stage_base += full;
        p->stage_len -= full;
        p->stage_written = partial ? p->stage_len : 0;
        p->writer_unsynced = true;
        return 0;
}

/* An injected failure of the writer's sync: the records it should have
 * made durable are zeros on the disk, through another descriptor (the
 * writer's own takes whole pages only). */
static int writer_datasync_fault(Store *s, struct Packs *p) {
        static const uint8_t zeros[PACK_PAGE];
        _cleanup_close_ int fd = -EBADF;
        uint64_t end = p->stage_base + p->stage_len;
        char name[32];

        pack_file_name(p->writer_id, name);
        fd = openat(s->packs_fd, name, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -EIO;
        for (uint64_t at = p->synced_end; at < end; at += MIN((uint64_t) PACK_PAGE, end - at))
                (void) pwrite(fd, zeros, (size_t) MIN((uint64_t) PACK_PAGE, end - at), (off_t) at);
        (void) fdatasync(fd);
        return -EIO;
}

static int writer_datasync(Store *s, struct Packs *p) {
        if (pack_fault())
                return writer_datasync_fault(s, p);
        return fdatasync(p->writer_fd) < 0 ? -errno : 0;
}

/* Makes everything appended to the writer's pack durable. */
static int writer_sync(Store *s, struct Packs *p) {
        int r;

        if (p->failed < 0)
                return p->failed;
        if (p->writer_fd < 0)
                return 0;
        r = stage_write(p, true);
        if (r < 0)
                return r;
        if (p->writer_unsynced) {
                r = writer_datasync(s, p);
                if (r < 0) {
                        store_log("a sync of pack %" PRIu64 " failed: %s. No block written to it since its last "
                                  "sync is used, and nothing this process writes is committed any more.",
                                  p->writer_id, strerror(-r));
                        return (p->failed = r);
                }
        }
        p->writer_unsynced = false;
        p->synced_end = p->writer_end;
        return 0;
}

/* Appends an encoded record to the writer's pack, unless the same block
 * was appended meanwhile. Caller holds p->lock. */
static int record_append(Store *s, const uint8_t *record, size_t n, const Digest *d, size_t len,
                         BlockLocation *ret) {
        struct Packs *p = s->packs;
        PendingBlock *pb = pending_find(p, d);
        BlockLocation loc;
        int r;

        if (p->failed < 0)
                return p->failed;
        if (pb) {
                *ret = pb->loc;
                return 0;
        }
        if (p->writer_fd < 0 || p->writer_end >= p->pack_max_bytes) {
                r = writer_sync(s, p);
                if (r < 0)
                        return r;
                r = writer_open_new_pack(s);
                if (r < 0)
                        return r;
        }
        if (p->stage_len + n > STAGE_BYTES) {
                r = stage_write(p, false);
                if (r < 0)
                        return r;
        }
        memcpy(p->stage + p->stage_len, record, n);
        p->stage_len += n;

        loc = (BlockLocation) {
                .pack = p->writer_id,
                .offset = p->writer_end,
                .stored_len = (uint32_t) (n - sizeof(PackRecordHeader)),
                .raw_len = (uint32_t) len,
        };
        r = pending_add(p, d, &loc);
        if (r < 0)
                return r;
        p->writer_end += n;
        *ret = loc;
        return 0;
}

int block_put(Store *s, const void *data, size_t len, const Digest *d, BlockLocation *ret) {
        struct Packs *p = s->packs;
        size_t n;
        int r;

        if (len == 0 || len > STORE_BLOCK_SIZE)
                return -EINVAL;

        r = lookup_for_put(s, d, ret);
        if (r != -ENOENT)
                return r;

        MUTEX_LOCKED(&p->lock);
        n = record_encode(s, p->cctx, p->scratch, data, len, d);
        return record_append(s, p->scratch, n, d, len, ret);
}

/* ---- putting many blocks: compressed by several threads ---- */

typedef struct Encoder {
        Store *store;
        BlockPut *puts;
        size_t n;
        size_t next;            /* the next put to take, under lock */
        pthread_mutex_t lock;
} Encoder;

static void *encoder_run(void *userdata) {
        Encoder *e = userdata;
        ZSTD_CCtx *cctx = ZSTD_createCCtx();

        if (cctx)
                (void) ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, STORE_ZSTD_LEVEL);
        for (;;) {
                BlockPut *b;

                {
                        MUTEX_LOCKED(&e->lock);
                        if (e->next >= e->n)
                                break;
                        b = &e->puts[e->next++];
                }
                if (b->result != -ENOENT)
                        continue; /* stored already, or failed */
                b->record = cctx ? malloc(record_max()) : NULL;
                if (!b->record) {
                        b->result = -ENOMEM;
                        continue;
                }
                b->record_len = record_encode(e->store, cctx, b->record, b->data, b->len, &b->digest);
        }
        ZSTD_freeCCtx(cctx);
        return NULL;
}

/* Encodes every put that needs it with up to ENCODER_THREADS threads, this
 * one included: compression is what a large write waits for. */
static void encode_parallel(Store *s, BlockPut *puts, size_t n, size_t n_new) {
        Encoder e = { .store = s, .puts = puts, .n = n };
        pthread_t threads[ENCODER_THREADS - 1];
        size_t n_threads = 0, want;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);

        want = MIN((size_t) MAX(cpus, 1L), (size_t) ENCODER_THREADS);
        want = MIN(want, DIV_ROUND_UP(n_new, ENCODER_MIN_BLOCKS));
        pthread_mutex_init(&e.lock, NULL);
        while (n_threads + 1 < want && pthread_create(&threads[n_threads], NULL, encoder_run, &e) == 0)
                n_threads++;
        (void) encoder_run(&e);
        for (size_t i = 0; i < n_threads; i++)
                (void) pthread_join(threads[i], NULL);
        pthread_mutex_destroy(&e.lock);
}

void block_put_many(Store *s, BlockPut *puts, size_t n) {
        struct Packs *p = s->packs;
        size_t n_new = 0;

        for (size_t i = 0; i < n; i++) {
                BlockPut *b = &puts[i];

                b->record = NULL;
                if (b->len == 0 || b->len > STORE_BLOCK_SIZE)
                        b->result = -EINVAL;
                else
                        b->result = lookup_for_put(s, &b->digest, &b->loc);
                n_new += b->result == -ENOENT;
        }
        if (n_new == 0)
                return;

        encode_parallel(s, puts, n, n_new);

        MUTEX_LOCKED(&p->lock);
        for (size_t i = 0; i < n; i++) {
                BlockPut *b = &puts[i];

                if (b->result == -ENOENT) {
                        b->result = record_append(s, b->record, b->record_len, &b->digest, b->len, &b->loc);
                        if (b->result >= 0)
                                space_used(s, b->record_len);
                }
                b->record = mfree(b->record);
        }
}

int block_commit(Store *s) {
        struct Packs *p = s->packs;
        _cleanup_stmt_ sqlite3_stmt *st = NULL, *healed = NULL;
        int r;

        MUTEX_LOCKED(&p->lock);
        r = writer_sync(s, p);
        if (r < 0)
                return r;
        if (p->n_pending == 0) {
                packs_release_retired(p);
                return 0;
        }

        CATALOG_LOCKED(s);
        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;
        /* A block whose record was found damaged, stored anew: the index
         * names the new record from now on, for every file that uses it. */
        r = sqlite_prepare(s->catalog, "INSERT INTO blocks(digest, pack, offset, stored_len, raw_len) "
                                       "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(digest) DO UPDATE SET "
                                       "pack = excluded.pack, offset = excluded.offset, "
                                       "stored_len = excluded.stored_len, raw_len = excluded.raw_len "
                                       "WHERE EXISTS (SELECT 1 FROM damaged_blocks WHERE digest = excluded.digest)",
                         &st);
        if (r >= 0)
                r = sqlite_prepare(s->catalog, "DELETE FROM damaged_blocks WHERE digest = ?1", &healed);
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < p->n_pending; i++) {
                const PendingBlock *pb = &p->pending[i];

                sqlite3_bind_blob(st, 1, pb->digest.bytes, sizeof pb->digest.bytes, SQLITE_STATIC);
                sqlite3_bind_int64(st, 2, (sqlite3_int64) pb->loc.pack);
                sqlite3_bind_int64(st, 3, (sqlite3_int64) pb->loc.offset);
                sqlite3_bind_int(st, 4, (int) pb->loc.stored_len);
                sqlite3_bind_int(st, 5, (int) pb->loc.raw_len);
                r = sqlite_step_done(st);
                if (r >= 0) {
                        sqlite3_bind_blob(healed, 1, pb->digest.bytes, sizeof pb->digest.bytes, SQLITE_STATIC);
                        r = sqlite_step_done(healed);
                }
                if (r < 0)
                        goto fail;
        }
        r = sqlite_commit(s->catalog);
        if (r < 0)
                goto fail;
        p->n_pending = 0;
        packs_release_retired(p);
        return 0;
fail:
        sqlite_rollback(s->catalog);
        return r;
}

bool block_writer_failed(Store *s) {
        struct Packs *p = s->packs;

        MUTEX_LOCKED(&p->lock);
        return p->failed < 0;
}

void block_count_corruption(Store *s) {
        CATALOG_LOCKED(s);
        (void) sqlite_exec(s->catalog, "UPDATE counters SET value = value + 1 WHERE key = 'corruption_events'");
}

int pack_fd(Store *s, uint64_t pack) {
        struct Packs *p = s->packs;
        PackFd *slot;
        char name[32];
        int fd;

        /* Caller holds p->lock. The writer's own descriptor is for direct
         * I/O only: reads go through one of these. */
        for (size_t i = 0; i < PACK_FD_CACHE; i++)
                if (p->fds[i].fd >= 0 && p->fds[i].id == pack)
                        return p->fds[i].fd;

        pack_file_name(pack, name);
        fd = openat(s->packs_fd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        slot = &p->fds[p->next_fd_slot++ % PACK_FD_CACHE];
        safe_close(slot->fd);
        *slot = (PackFd) { .id = pack, .fd = fd };
        return fd;
}

/* Reads a record's bytes: from the pack file, and where the writer has not
 * written them yet, from its buffer. Caller holds p->lock. */
static ssize_t pack_read(Store *s, uint64_t pack, uint64_t offset, void *buf, size_t len) {
        struct Packs *p = s->packs;
        size_t from_file = len, done;
        ssize_t k;
        int fd;

        if (pack == p->writer_id && p->writer_fd >= 0)
                from_file = offset < p->stage_base ? (size_t) MIN((uint64_t) len, p->stage_base - offset) : 0;
        if (from_file > 0) {
                fd = pack_fd(s, pack);
                if (fd < 0)
                        return fd;
                k = pread(fd, buf, from_file, (off_t) offset);
                if (k < 0)
                        return -errno;
                if ((size_t) k < from_file)
                        return k;
        }
        done = from_file;
        if (done < len) {
                uint64_t at = offset + done - p->stage_base;

                if (at < p->stage_len) {
                        size_t n = MIN(len - done, p->stage_len - (size_t) at);
                        memcpy((uint8_t *) buf + done, p->stage + at, n);
                        done += n;
                }
        }
        return (ssize_t) done;
}

int pack_record_decode(Store *s, ZSTD_DCtx *dctx, const void *record, size_t record_len, const Digest *expect,
                       void *buf, const char **ret_reason) {
        const PackRecordHeader *h = record;
        const uint8_t *payload = (const uint8_t *) record + sizeof *h;
        Digest actual;
        size_t n;

#define BAD(reason) ({ if (ret_reason) *ret_reason = (reason); -EIO; })
        if (record_len < sizeof *h)
                return BAD("truncated record");
        if (h->magic != PACK_RECORD_MAGIC || h->version != 1)
                return BAD("bad record header");
        if (h->header_check != XXH32(h, offsetof(PackRecordHeader, header_check), 0))
                return BAD("header checksum mismatch");
        if (h->stored_len != record_len - sizeof *h || h->raw_len == 0 || h->raw_len > STORE_BLOCK_SIZE)
                return BAD("record length mismatch");
        if (memcmp(h->digest, expect->bytes, sizeof h->digest) != 0)
                return BAD("record holds another block");

        /* The payload's own checksum is not needed to catch damage: zstd is
         * safe on any input, and the content's digest below is checked
         * end to end. It only tells, once something failed, whether the
         * stored bytes changed: a read verifies each byte once, not twice
         * (for incompressible data, half the cost of checksums). */
#define PAYLOAD_BAD(reason) \
        BAD(h->payload_check != XXH3_64bits(payload, h->stored_len) ? "data checksum mismatch" : (reason))
        if (h->compression == PACK_COMPRESSION_ZSTD) {
                if (zstd_decompress(s, dctx, buf, STORE_BLOCK_SIZE, payload, h->stored_len, &n) < 0 ||
                    n != h->raw_len)
                        return PAYLOAD_BAD("decompression failed");
        } else if (h->compression == PACK_COMPRESSION_NONE) {
                if (h->stored_len != h->raw_len)
                        return BAD("record length mismatch");
                memcpy(buf, payload, h->raw_len);
        } else
                return BAD("unknown compression");

        /* zstd may use the buffer past the content as scratch (wild copies):
         * what lies past a short block must read as zeros. */
        memset((uint8_t *) buf + h->raw_len, 0, STORE_BLOCK_SIZE - h->raw_len);

        /* The end-to-end check: the content is the block that was asked for. */
        block_digest(s, buf, h->raw_len, &actual);
        if (memcmp(actual.bytes, expect->bytes, sizeof actual.bytes) != 0)
                return PAYLOAD_BAD("content digest mismatch");
#undef PAYLOAD_BAD
#undef BAD
        return (int) h->raw_len;
}

/* What a thread reads records with: blocks are read by many threads at
 * once, each with its own buffer and decompression context. */
typedef struct ReadScratch {
        uint8_t *record;
        ZSTD_DCtx *dctx;
} ReadScratch;

static pthread_key_t read_scratch_key;
static pthread_once_t read_scratch_once = PTHREAD_ONCE_INIT;

static void read_scratch_free(void *p) {
        ReadScratch *rs = p;

        free(rs->record);
        ZSTD_freeDCtx(rs->dctx);
        free(rs);
}

static void read_scratch_key_make(void) {
        (void) pthread_key_create(&read_scratch_key, read_scratch_free);
}

static ReadScratch *read_scratch(void) {
        ReadScratch *rs;

        (void) pthread_once(&read_scratch_once, read_scratch_key_make);
        rs = pthread_getspecific(read_scratch_key);
        if (rs)
                return rs;
        rs = calloc(1, sizeof *rs);
        if (!rs)
                return NULL;
        rs->record = malloc(record_max());
        rs->dctx = ZSTD_createDCtx();
        if (!rs->record || !rs->dctx || pthread_setspecific(read_scratch_key, rs) != 0) {
                read_scratch_free(rs);
                return NULL;
        }
        return rs;
}

/* Reads a record into buf: from the writer's buffer under the lock if it
 * is not all on disk yet, else from its pack without the lock, so that
 * reads of many threads reach the disk together. The number of bytes read. */
static ssize_t record_fetch(Store *s, const BlockLocation *loc, void *buf, size_t len) {
        struct Packs *p = s->packs;
        _cleanup_close_ int fd = -EBADF;
        ssize_t k;

        {
                MUTEX_LOCKED(&p->lock);
                if (loc->pack == p->writer_id && p->writer_fd >= 0 && loc->offset + len > p->stage_base)
                        return pack_read(s, loc->pack, loc->offset, buf, len);
                fd = pack_fd(s, loc->pack);
                if (fd < 0)
                        return fd;
                /* Ours: the cache may close its own meanwhile. */
                fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (fd < 0)
                        return -errno;
        }
        k = pread(fd, buf, len, (off_t) loc->offset);
        return k < 0 ? -errno : k;
}

static bool cache_get(struct Packs *p, const Digest *d, void *buf, int *ret_len) {
        MUTEX_LOCKED(&p->lock);
        CachedBlock *c = &p->cache[d->bytes[0] % READ_CACHE_SLOTS];

        if (!c->valid || memcmp(c->digest.bytes, d->bytes, sizeof d->bytes) != 0)
                return false;
        memcpy(buf, c->data, c->len);
        memset((uint8_t *) buf + c->len, 0, STORE_BLOCK_SIZE - c->len);
        *ret_len = (int) c->len;
        return true;
}

static void cache_put(struct Packs *p, const Digest *d, const void *buf, size_t len) {
        MUTEX_LOCKED(&p->lock);
        CachedBlock *c = &p->cache[d->bytes[0] % READ_CACHE_SLOTS];

        if (!c->data)
                c->data = malloc(STORE_BLOCK_SIZE);
        if (!c->data)
                return;
        memcpy(c->data, buf, len);
        c->digest = *d;
        c->len = (uint32_t) len;
        c->valid = true;
}

/* Reads and verifies the record at loc; the decoded block goes to buf (if
 * not NULL) and the record stays in the thread's scratch. */
static int record_read(Store *s, const Digest *d, const BlockLocation *loc, void *buf, ReadScratch *rs,
                       const char **ret_reason) {
        size_t len = sizeof(PackRecordHeader) + loc->stored_len;
        ssize_t k;

        if (loc->stored_len > ZSTD_compressBound(STORE_BLOCK_SIZE)) {
                if (ret_reason)
                        *ret_reason = "index entry damaged";
                return -EIO;
        }
        k = record_fetch(s, loc, rs->record, len);
        if (k < 0) {
                if (k == -ENOENT && ret_reason)
                        *ret_reason = "pack file missing";
                return k == -ENOENT ? -EIO : (int) k;
        }
        return pack_record_decode(s, rs->dctx, rs->record, (size_t) k == len ? len : sizeof(PackRecordHeader) - 1,
                                  d, buf, ret_reason);
}

static int block_read_verified(Store *s, const Digest *d, const BlockLocation *loc, void *buf, bool cached,
                               const char **ret_reason) {
        ReadScratch *rs;
        int r;

        if (cached && cache_get(s->packs, d, buf, &r))
                return r;
        rs = read_scratch();
        if (!rs)
                return -ENOMEM;
        r = record_read(s, d, loc, buf, rs, ret_reason);
        if (r >= 0)
                cache_put(s->packs, d, buf, (size_t) r);
        return r;
}

int block_read_at_reason(Store *s, const Digest *d, const BlockLocation *loc, void *buf, const char **ret_reason) {
        /* A scrub reads what is on disk, never the cache. */
        return block_read_verified(s, d, loc, buf, !ret_reason, ret_reason);
}

/* Each process names the first damaged blocks it meets: enough to tell
 * where to look (scrub names them all), not a line per read of a damaged
 * file. */
#define DAMAGE_LOGGED_MAX 10

static void damage_log(const Digest *d, const BlockLocation *loc, const char *reason) {
        static unsigned logged;
        unsigned n = __atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED);
        char hex[33];

        if (n >= DAMAGE_LOGGED_MAX)
                return;
        digest_to_hex(d, hex);
        if (loc)
                store_log("block %s (pack %" PRIu64 ", offset %" PRIu64 ") is damaged: %s. Reads of it fail "
                          "with EIO%s", hex, loc->pack, loc->offset, reason ?: "unreadable",
                          n + 1 == DAMAGE_LOGGED_MAX ? "; more damaged blocks are counted, not logged." : ".");
        else
                store_log("block %s is referenced but not in the index. Reads of it fail with EIO%s", hex,
                          n + 1 == DAMAGE_LOGGED_MAX ? "; more damaged blocks are counted, not logged." : ".");
}

int block_read_at(Store *s, const Digest *d, const BlockLocation *loc, void *buf) {
        const char *reason = NULL;
        int r;

        r = block_read_verified(s, d, loc, buf, true, &reason);
        if (r == -EIO) {
                block_count_corruption(s);
                block_mark_damaged(s, d);
                damage_log(d, loc, reason);
        }
        return r;
}

int block_read(Store *s, const Digest *d, void *buf) {
        BlockLocation loc;
        int r;

        r = block_lookup(s, d, &loc);
        if (r == -ENOENT) {
                /* A layer references a block the index does not know. */
                block_count_corruption(s);
                damage_log(d, NULL, NULL);
                return -EIO;
        }
        if (r < 0)
                return r;
        return block_read_at(s, d, &loc, buf);
}

int block_read_stored_zstd(Store *s, const Digest *d, void *buf, size_t *ret_len) {
        _cleanup_free_ uint8_t *plain = NULL;
        const PackRecordHeader *h;
        const uint8_t *payload;
        BlockLocation loc;
        ReadScratch *rs;
        int r;

        r = block_lookup(s, d, &loc);
        if (r == -ENOENT)
                return -EIO;
        if (r < 0)
                return r;
        plain = malloc(STORE_BLOCK_SIZE);
        rs = read_scratch();
        if (!plain || !rs)
                return -ENOMEM;

        /* Decoding verifies every checksum of the record. */
        r = record_read(s, d, &loc, plain, rs, NULL);
        if (r == -EIO) {
                block_count_corruption(s);
                block_mark_damaged(s, d);
        }
        if (r < 0)
                return r;
        h = (const PackRecordHeader *) rs->record;
        payload = rs->record + sizeof *h;
        /* A frame made with the store's dictionary means nothing to others. */
        if (h->compression != PACK_COMPRESSION_ZSTD || h->stored_len > STORE_BLOCK_SIZE ||
            ZSTD_getDictID_fromFrame(payload, h->stored_len) != 0)
                return -ENODATA;
        memcpy(buf, payload, h->stored_len);
        *ret_len = h->stored_len;
        return 0;
}

int pack_is_written(Store *s, uint64_t pack) {
        _cleanup_close_ int fd = -EBADF;
        char name[32];

        pack_file_name(pack, name);
        fd = openat(s->packs_fd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) >= 0)
                return 0;
        return errno == EWOULDBLOCK ? 1 : -errno;
}

int pack_punch(Store *s, uint64_t pack, const BlockRow *rows, size_t n) {
        struct Packs *p = s->packs;
        _cleanup_close_ int fd = -EBADF;
        char name[32];

        {
                MUTEX_LOCKED(&p->lock);
                for (size_t i = 0; i < n; i++) {
                        CachedBlock *c = &p->cache[rows[i].digest.bytes[0] % READ_CACHE_SLOTS];
                        KnownLocation *k = location_slot(p, &rows[i].digest);

                        if (c->valid && memcmp(c->digest.bytes, rows[i].digest.bytes, sizeof c->digest.bytes) == 0)
                                c->valid = false;
                        if (k && k->valid && memcmp(k->digest.bytes, rows[i].digest.bytes, sizeof k->digest.bytes) == 0)
                                k->valid = false;
                }
        }

        pack_file_name(pack, name);
        fd = openat(s->packs_fd, name, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        /* Records written one after the other go in one punch, pages
         * between them included. */
        for (size_t i = 0; i < n;) {
                uint64_t start = rows[i].loc.offset, end = start;

                for (; i < n && rows[i].loc.offset <= end; i++)
                        end = MAX(end, rows[i].loc.offset + sizeof(PackRecordHeader) + rows[i].loc.stored_len);
                if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t) start, (off_t) (end - start)) < 0)
                        return errno == EOPNOTSUPP ? 0 : -errno;
        }
        return 0;
}

uint64_t packs_disk_bytes(Store *s) {
        _cleanup_closedir_ DIR *d = opendir_dup(s->packs_fd);
        struct dirent *de;
        uint64_t total = 0;

        if (!d)
                return 0;
        while ((de = readdir(d))) {
                struct stat st;

                if (de->d_name[0] != '.' && fstatat(dirfd(d), de->d_name, &st, 0) >= 0)
                        total += (uint64_t) st.st_blocks * 512;
        }
        return total;
}
