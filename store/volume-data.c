/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * File contents. Small files live inline in their inode row; larger ones
 * are cut into STORE_BLOCK_SIZE blocks at aligned offsets. Writes change blocks
 * in memory (dirty blocks) and a commit turns them into stored blocks, so
 * that a run of small writes costs one block write, not one per call.
 *
 * Invariant: no stored or dirty block holds non-zero bytes past the end of
 * its file, so that growing a file needs no zeroing.
 */

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <string.h>

#include "alloc-util.h"
#include "sqlite-util.h"
#include "time-util.h"
#include "volume-internal.h"

/* A file of up to this many blocks has its dirty blocks looked up one by
 * one; past it, a walk through every bucket costs less. */
#define DIRTY_LOOKUP_BLOCKS (DIRTY_BUCKETS / 64)
/* A dirty block's data grows by this much at least. */
#define DIRTY_PAGE 4096u

static size_t dirty_bucket(uint64_t ino, uint64_t idx) {
        return (size_t) ((ino * 0x9E3779B97F4A7C15ull) ^ idx) % DIRTY_BUCKETS;
}

static DirtyBlock *dirty_find(Volume *v, uint64_t ino, uint64_t idx) {
        for (DirtyBlock *b = v->dirty[dirty_bucket(ino, idx)]; b; b = b->next)
                if (b->ino == ino && b->idx == idx)
                        return b;
        return NULL;
}

/* Unlinks nothing: the caller has taken b out of its bucket. */
static void dirty_free(Volume *v, DirtyBlock *b) {
        free(b->data);
        free(b);
        v->n_dirty--;
        space_release(v->store, STORE_BLOCK_SIZE);
}

/* The caller checked the space (or is cleaning up); the block holds it
 * until it is stored or dropped. */
static DirtyBlock *dirty_new(Volume *v, uint64_t ino, uint64_t idx) {
        size_t h = dirty_bucket(ino, idx);
        DirtyBlock *b;

        b = calloc(1, sizeof *b);
        if (!b)
                return NULL;
        b->ino = ino;
        b->idx = idx;
        b->next = v->dirty[h];
        v->dirty[h] = b;
        v->n_dirty++;
        space_hold(v->store, STORE_BLOCK_SIZE);
        return b;
}

static bool data_forget_dirty_one(Volume *v, uint64_t ino, uint64_t idx);

/* Forgets the dirty blocks of ino from first_idx on (of every inode if ino
 * is 0). size is the file's: the blocks of a small one are looked up one
 * by one instead of searching every bucket (no dirty block lies past the
 * end of its file, and one that did would be dropped by the next commit). */
void data_forget_dirty(Volume *v, uint64_t ino, uint64_t first_idx, uint64_t size) {
        uint64_t end_idx = DIV_ROUND_UP(size, STORE_BLOCK_SIZE);

        if (v->n_dirty == 0)
                return;
        if (ino != 0 && end_idx <= first_idx + DIRTY_LOOKUP_BLOCKS) {
                for (uint64_t idx = first_idx; idx < end_idx; idx++)
                        if (data_forget_dirty_one(v, ino, idx))
                                v->memory_changes++;
                return;
        }
        for (size_t h = 0; h < DIRTY_BUCKETS; h++) {
                DirtyBlock **p = &v->dirty[h];

                while (*p) {
                        DirtyBlock *b = *p;

                        if (ino == 0 || (b->ino == ino && b->idx >= first_idx)) {
                                *p = b->next;
                                dirty_free(v, b);
                                v->memory_changes++;
                        } else
                                p = &b->next;
                }
        }
}

/* Reads block idx of the file as stored (not the dirty copy) into buf,
 * zero-filled to STORE_BLOCK_SIZE. */
static int block_load(Volume *v, const InodeRow *row, uint64_t idx, uint8_t *buf) {
        Digest d;
        uint32_t len;
        bool hole;
        int r;

        memset(buf, 0, STORE_BLOCK_SIZE);
        r = extent_get(v, row, idx, &d, &len, &hole);
        if (r < 0 || hole)
                return r;
        r = block_read(v->store, &d, buf);
        if (r < 0)
                return r;
        /* A cut made above the layer that stored the block. */
        if ((uint32_t) r > len)
                memset(buf + len, 0, (size_t) r - len);
        return 0;
}

/* Returns whether there was such a block. */
static bool data_forget_dirty_one(Volume *v, uint64_t ino, uint64_t idx) {
        for (DirtyBlock **p = &v->dirty[dirty_bucket(ino, idx)]; *p; p = &(*p)->next)
                if ((*p)->ino == ino && (*p)->idx == idx) {
                        DirtyBlock *b = *p;

                        *p = b->next;
                        dirty_free(v, b);
                        return true;
                }
        return false;
}

/* Makes the first end bytes of b's data addressable; those it adds are
 * zeros, as they were. Grows by pages, doubling. */
static int dirty_reserve(DirtyBlock *b, size_t end) {
        size_t capacity;
        uint8_t *p;

        if (end <= b->capacity)
                return 0;
        capacity = MIN(MAX(DIV_ROUND_UP(end, DIRTY_PAGE) * DIRTY_PAGE, 2 * b->capacity), (size_t) STORE_BLOCK_SIZE);
        p = realloc(b->data, capacity);
        if (!p)
                return -ENOMEM;
        memset(p + b->capacity, 0, capacity - b->capacity);
        b->data = p;
        b->capacity = capacity;
        return 0;
}

/* Copies n bytes of b from offset from, zeros where its data ends. */
static void dirty_copy(const DirtyBlock *b, size_t from, uint8_t *out, size_t n) {
        size_t have = from < b->capacity ? MIN(n, b->capacity - from) : 0;

        if (have > 0)
                memcpy(out, b->data + from, have);
        memset(out + have, 0, n - have);
}

/* Zeros n bytes of b from offset from; past its data they are zeros
 * already. */
static void dirty_zero(Volume *v, DirtyBlock *b, size_t from, size_t n) {
        v->memory_changes++;
        if (from < b->capacity)
                memset(b->data + from, 0, MIN(n, b->capacity - from));
}

static int dirty_get(Volume *v, const InodeRow *row, uint64_t idx, bool load, DirtyBlock **ret) {
        DirtyBlock *b;
        int r;

        b = dirty_find(v, row->ino, idx);
        if (!b) {
                b = dirty_new(v, row->ino, idx);
                if (!b)
                        return -ENOMEM;
                if (load && idx * STORE_BLOCK_SIZE < row->size) {
                        r = dirty_reserve(b, STORE_BLOCK_SIZE);
                        if (r >= 0)
                                r = block_load(v, row, idx, b->data);
                        if (r < 0) {
                                data_forget_dirty_one(v, row->ino, idx);
                                return r;
                        }
                }
        }
        b->seq = ++v->dirty_seq; /* the caller changes it */
        b->changed_usec = monotonic_usec();
        *ret = b;
        return 0;
}

static bool is_zero(const uint8_t *p, size_t n) {
        return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Stores a batch of dirty blocks. Those that are stored, zero, or past
 * their file's end leave memory; those of unlinked inodes, and those that
 * do not fit on the disk, stay. */
static int flush_batch(Volume *v, DirtyBlock **blocks, size_t n, uint64_t must_ino, int *failed) {
        BlockPut puts[FLUSH_BATCH];
        DirtyBlock *put_blocks[FLUSH_BATCH];
        size_t n_puts = 0;
        int r;

        for (size_t i = 0; i < n; i++) {
                _cleanup_(inode_row_clear) InodeRow row = {};
                DirtyBlock *b = blocks[i];
                uint64_t start = b->idx * STORE_BLOCK_SIZE;
                size_t len;

                r = inode_get(v, b->ino, &row);
                if (r == -ENOENT)
                        r = 0, row.size = 0; /* dropped meanwhile */
                if (r < 0)
                        return r;
                if (row.size > 0 && row.nlink == 0)
                        continue; /* nothing will read it after a restart */
                if (start >= row.size) {
                        data_forget_dirty_one(v, b->ino, b->idx);
                        continue;
                }
                len = (size_t) MIN((uint64_t) STORE_BLOCK_SIZE, row.size - start);
                if (!is_zero(b->data, MIN(len, b->capacity))) {
                        r = dirty_reserve(b, len);
                        if (r < 0)
                                return r;
                        puts[n_puts] = (BlockPut) { .data = b->data, .len = len };
                        block_digest(v->store, b->data, len, &puts[n_puts].digest);
                        put_blocks[n_puts++] = b;
                        continue;
                }
                r = extent_put(v, b->ino, b->idx, NULL, 0, 0);
                if (r < 0 && r != -ENOSPC)
                        return r;
                if (r == -ENOSPC) {
                        if (*failed == 0 && (must_ino == 0 || must_ino == b->ino))
                                *failed = r;
                        continue;
                }
                data_forget_dirty_one(v, b->ino, b->idx);
        }

        block_put_many(v->store, puts, n_puts);
        for (size_t i = 0; i < n_puts; i++) {
                DirtyBlock *b = put_blocks[i];

                r = puts[i].result;
                if (r >= 0)
                        r = extent_put(v, b->ino, b->idx, &puts[i].digest, (uint32_t) puts[i].len,
                                       puts[i].loc.stored_len);
                if (r == -ENOSPC) {
                        if (*failed == 0 && (must_ino == 0 || must_ino == b->ino))
                                *failed = r;
                        continue;
                }
                if (r < 0)
                        return r;
                data_forget_dirty_one(v, b->ino, b->idx);
        }
        return 0;
}

/* Turns dirty blocks into stored blocks and their extent rows. A block
 * that does not fit on the disk stays dirty and the others go on: a full
 * disk fails the fsync of the files it concerns, not every commit. Blocks
 * of unlinked inodes stay in memory until the inode is dropped: nothing
 * will ever read them after a restart. Returns < 0 only when the flush
 * cannot go on; the first ENOSPC (of ino's blocks if must_ino is given) is
 * in *ret_failed. */
int data_flush_all(Volume *v, uint64_t must_ino, int *ret_failed) {
        _cleanup_free_ DirtyBlock **blocks = NULL;
        size_t n = 0;
        int r, failed = 0;

        if (v->n_dirty == 0)
                goto done;
        if (v->gc_fd < 0) {
                r = gc_lock_shared(v->store, &v->gc_fd);
                if (r < 0)
                        return r;
        }

        /* Listed first: storing a block takes it out of its bucket. */
        blocks = malloc(v->n_dirty * sizeof *blocks);
        if (!blocks)
                return -ENOMEM;
        for (size_t h = 0; h < DIRTY_BUCKETS; h++)
                for (DirtyBlock *b = v->dirty[h]; b; b = b->next)
                        blocks[n++] = b;
        for (size_t i = 0; i < n; i += FLUSH_BATCH) {
                r = flush_batch(v, blocks + i, MIN((size_t) FLUSH_BATCH, n - i), must_ino, &failed);
                if (r < 0)
                        return r;
        }
done:
        if (ret_failed)
                *ret_failed = failed;
        return 0;
}

/* A whole block copied out of memory to be stored without the lock. */
typedef struct AheadBlock {
        uint64_t ino;
        uint64_t idx;
        uint64_t seq;
} AheadBlock;

/* Copies up to FLUSH_BATCH dirty blocks that lie wholly inside their file
 * and were left alone for a while into data (the block being appended to
 * stays behind: it is not done). Sets when the young ones left behind are
 * old enough. */
static int flush_ahead_pick(Volume *v, AheadBlock *picked, uint8_t *data, size_t *ret_n) {
        uint64_t size_ino = 0, size = 0, now = monotonic_usec(), youngest = 0;
        size_t n = 0;
        int r;

        for (size_t h = 0; h < DIRTY_BUCKETS && n < FLUSH_BATCH; h++)
                for (DirtyBlock *b = v->dirty[h]; b && n < FLUSH_BATCH; b = b->next) {
                        if (b->ino != size_ino) {
                                _cleanup_(inode_row_clear) InodeRow row = {};

                                r = inode_get_attr(v, b->ino, &row);
                                if (r == -ENOENT)
                                        continue;
                                if (r < 0)
                                        return r;
                                size_ino = b->ino;
                                size = row.nlink > 0 ? row.size : 0;
                        }
                        if ((b->idx + 1) * STORE_BLOCK_SIZE > size || is_zero(b->data, b->capacity))
                                continue; /* not done, or a hole the commit makes */
                        if (now - b->changed_usec < FLUSH_AHEAD_AGE_USEC) {
                                youngest = MAX(youngest, b->changed_usec);
                                continue;
                        }
                        picked[n] = (AheadBlock) { .ino = b->ino, .idx = b->idx, .seq = b->seq };
                        dirty_copy(b, 0, data + n * STORE_BLOCK_SIZE, STORE_BLOCK_SIZE);
                        n++;
                }
        v->flush_ahead_retry_usec = youngest ? youngest + FLUSH_AHEAD_AGE_USEC : 0;
        *ret_n = n;
        return 0;
}

/* Stores whole dirty blocks ahead of the commit: picked and copied under
 * the lock, digested and compressed without it, and their extents put
 * under it again, each only if nobody changed the block meanwhile (else
 * the stored copy is left for the reaper). The GC lock is taken before
 * the first block is stored and held until the commit that references
 * them; while a reaper holds it, nothing is done. Returns how many blocks
 * it picked. */
int data_flush_ahead(Volume *v) {
        _cleanup_free_ uint8_t *data = NULL;
        AheadBlock picked[FLUSH_BATCH];
        BlockPut puts[FLUSH_BATCH];
        size_t n = 0;
        int r;

        v->flush_ahead_at = v->n_dirty + FLUSH_AHEAD_BLOCKS;
        if (!v->writable || v->failed || v->n_dirty == 0)
                return 0;
        data = malloc((size_t) FLUSH_BATCH * STORE_BLOCK_SIZE);
        if (!data)
                return -ENOMEM;
        /* A reaper at work: writers should not wait for it here. */
        if (v->gc_fd < 0) {
                r = gc_try_lock_shared(v->store, &v->gc_fd);
                if (r < 0)
                        return r == -EAGAIN ? 0 : r;
        }

        r = flush_ahead_pick(v, picked, data, &n);
        if (r < 0 || n == 0)
                return r;

        v->flushing_ahead = true;
        pthread_mutex_unlock(&v->lock);
        for (size_t i = 0; i < n; i++) {
                puts[i] = (BlockPut) { .data = data + i * STORE_BLOCK_SIZE, .len = STORE_BLOCK_SIZE };
                block_digest(v->store, puts[i].data, STORE_BLOCK_SIZE, &puts[i].digest);
        }
        block_put_many(v->store, puts, n);
        pthread_mutex_lock(&v->lock);
        v->flushing_ahead = false;

        for (size_t i = 0; i < n; i++) {
                DirtyBlock *b = dirty_find(v, picked[i].ino, picked[i].idx);

                if (!b || b->seq != picked[i].seq || puts[i].result < 0)
                        continue; /* changed, stored or dropped meanwhile; or no room: the commit tries */
                r = extent_put(v, picked[i].ino, picked[i].idx, &puts[i].digest, STORE_BLOCK_SIZE,
                               puts[i].loc.stored_len);
                if (r == -ENOSPC)
                        continue;
                if (r < 0)
                        return r;
                data_forget_dirty_one(v, picked[i].ino, picked[i].idx);
        }
        v->flush_ahead_at = v->n_dirty + FLUSH_AHEAD_BLOCKS;
        return (int) n;
}

/* A part of a read that comes from a stored block. */
typedef struct ReadPiece {
        size_t at;              /* in the caller's buffer */
        size_t in_block;
        size_t n;
        Digest digest;
        uint32_t len;           /* of the block as this file sees it */
} ReadPiece;

/* Caller holds the volume's lock. Fills in what memory holds (inline
 * contents, dirty blocks, holes) and lists the stored blocks to read.
 * Returns the size of the read. */
static ssize_t read_plan(Volume *v, uint64_t ino, uint8_t *out, size_t size, uint64_t offset, ReadPiece **ret,
                         size_t *ret_n) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        _cleanup_free_ ReadPiece *pieces = NULL;
        size_t done = 0, n = 0;
        int r;

        *ret = NULL;
        *ret_n = 0;
        r = inode_get(v, ino, &row);
        if (r < 0)
                return r;
        if (S_ISDIR(row.mode))
                return -EISDIR;
        if (!S_ISREG(row.mode))
                return -EINVAL;
        if (offset >= row.size)
                return 0;
        size = (size_t) MIN((uint64_t) size, row.size - offset);

        if (row.has_data) {
                size_t avail = offset < row.data_len ? row.data_len - (size_t) offset : 0;

                memcpy(out, row.data + offset, MIN(size, avail));
                if (size > avail)
                        memset(out + avail, 0, size - avail);
                return (ssize_t) size;
        }

        pieces = calloc(size / STORE_BLOCK_SIZE + 2, sizeof *pieces);
        if (!pieces)
                return -ENOMEM;
        while (done < size) {
                uint64_t pos = offset + done;
                uint64_t idx = pos / STORE_BLOCK_SIZE;
                size_t in_block = (size_t) (pos % STORE_BLOCK_SIZE);
                size_t k = MIN(size - done, (size_t) STORE_BLOCK_SIZE - in_block);
                DirtyBlock *b = dirty_find(v, ino, idx);
                ReadPiece *p = &pieces[n];
                bool hole;

                if (b)
                        dirty_copy(b, in_block, out + done, k);
                else {
                        r = extent_get(v, &row, idx, &p->digest, &p->len, &hole);
                        if (r < 0)
                                return r;
                        if (hole)
                                memset(out + done, 0, k);
                        else {
                                p->at = done;
                                p->in_block = in_block;
                                p->n = k;
                                n++;
                        }
                }
                done += k;
        }
        *ret = TAKE_PTR(pieces);
        *ret_n = n;
        return (ssize_t) size;
}

/* Reads the stored blocks of a plan; with count_damage, damage is counted
 * as corruption (the answer), else only reported. */
static int read_pieces(Volume *v, const ReadPiece *pieces, size_t n, uint8_t *out, bool count_damage) {
        _cleanup_free_ uint8_t *block = NULL;

        if (n == 0)
                return 0;
        block = malloc(STORE_BLOCK_SIZE);
        if (!block)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const ReadPiece *p = &pieces[i];
                BlockLocation loc;
                int r;

                if (count_damage)
                        r = block_read(v->store, &p->digest, block);
                else {
                        r = block_locate(v->store, &p->digest, &loc);
                        if (r >= 0)
                                r = block_read_at_reason(v->store, &p->digest, &loc, block, NULL);
                        if (r < 0)
                                block_forget_location(v->store, &p->digest);
                }
                if (r < 0)
                        return r;
                /* A cut made above the layer that stored the block. */
                if ((uint32_t) r > p->len)
                        memset(block + p->len, 0, (size_t) r - p->len);
                memcpy(out + p->at, block + p->in_block, p->n);
        }
        return 0;
}

/* Reads without holding the volume's lock while blocks come from the disk
 * and are decompressed, so that reads of many threads go on together. A
 * block is content-addressed and never changes; should one have gone
 * meanwhile (rewritten, committed and reaped), or fail, the read is done
 * again under the lock, which gives the answer and counts any damage. */
ssize_t volume_read(Volume *v, uint64_t ino, void *buf, size_t size, uint64_t offset) {
        _cleanup_free_ ReadPiece *pieces = NULL;
        size_t n = 0;
        ssize_t total;
        int r;

        {
                MUTEX_LOCKED(&v->lock);
                total = read_plan(v, ino, buf, size, offset, &pieces, &n);
        }
        if (total <= 0 || read_pieces(v, pieces, n, buf, false) >= 0)
                return total;

        pieces = mfree(pieces);
        MUTEX_LOCKED(&v->lock);
        total = read_plan(v, ino, buf, size, offset, &pieces, &n);
        if (total <= 0)
                return total;
        r = read_pieces(v, pieces, n, buf, true);
        return r < 0 ? r : total;
}

/* Moves an inline file's content into block 0, for a file about to grow
 * past INLINE_MAX. Nothing of the lower layers shows through afterwards. */
static int inline_to_blocks(Volume *v, InodeRow *row) {
        DirtyBlock *b;
        int r;

        if (row->data_len > 0) {
                r = dirty_get(v, row, 0, false, &b);
                if (r >= 0)
                        r = dirty_reserve(b, row->data_len);
                if (r < 0)
                        return r;
                v->memory_changes++;
                memset(b->data, 0, b->capacity);
                memcpy(b->data, row->data, row->data_len);
        }
        inode_row_clear(row);
        row->lower_limit = 0;
        return 0;
}

static int inline_resize(InodeRow *row, size_t size) {
        uint8_t *p;

        if (size == row->data_len)
                return 0;
        p = realloc(row->data, MAX(size, 1u));
        if (!p)
                return -ENOMEM;
        if (size > row->data_len)
                memset(p + row->data_len, 0, size - row->data_len);
        row->data = p;
        row->data_len = size;
        return 0;
}

void bytes_add(uint64_t *bytes, uint64_t n) {
        *bytes = MIN(*bytes, (uint64_t) INT64_MAX) + MIN(n, (uint64_t) INT64_MAX);
        *bytes = MIN(*bytes, (uint64_t) INT64_MAX);
}

void logical_size_changed(Volume *v, const InodeRow *row, uint64_t old_size, uint64_t new_size) {
        uint64_t *bytes = row->nlink > 0 ? &v->counters.logical_bytes : &v->orphan_bytes;

        bytes_add(bytes, new_size);
        *bytes -= MIN(*bytes, old_size);
}

/* Makes the blocks of [offset, offset + size) dirty and large enough,
 * reading those written in part: what can fail, before anything changes.
 * A block written whole is not read: until the copy, it holds zeros in
 * place of its stored data. Those made here are listed in fresh (room for
 * one per block of the range), for the caller to forget if it fails. */
static int blocks_prepare(Volume *v, const InodeRow *row, size_t size, uint64_t offset,
                          uint64_t *fresh, size_t *n_fresh) {
        *n_fresh = 0;
        for (uint64_t pos = offset; pos < offset + size;) {
                uint64_t idx = pos / STORE_BLOCK_SIZE;
                size_t in_block = (size_t) (pos % STORE_BLOCK_SIZE);
                size_t n = (size_t) MIN(offset + size - pos, (uint64_t) STORE_BLOCK_SIZE - in_block);
                DirtyBlock *b;
                int r;

                if (n == STORE_BLOCK_SIZE && !dirty_find(v, row->ino, idx))
                        fresh[(*n_fresh)++] = idx;
                r = dirty_get(v, row, idx, n < STORE_BLOCK_SIZE, &b);
                if (r >= 0)
                        r = dirty_reserve(b, in_block + n);
                if (r < 0)
                        return r;
                pos += n;
        }
        return 0;
}

/* Copies into the blocks blocks_prepare() made ready. */
static void blocks_copy_in(Volume *v, uint64_t ino, const uint8_t *in, size_t size, uint64_t offset) {
        v->memory_changes++;
        for (size_t done = 0; done < size;) {
                uint64_t pos = offset + done;
                size_t in_block = (size_t) (pos % STORE_BLOCK_SIZE);
                size_t n = MIN(size - done, (size_t) STORE_BLOCK_SIZE - in_block);
                DirtyBlock *b = dirty_find(v, ino, pos / STORE_BLOCK_SIZE);

                memcpy(b->data + in_block, in + done, n);
                done += n;
        }
}

/* Space for what the write adds: inline bytes, or the blocks it makes dirty. */
static int write_check_space(Volume *v, const InodeRow *row, uint64_t offset, uint64_t end) {
        uint64_t needed = 0;

        if (row->has_data && end <= INLINE_MAX)
                return space_check(v->store, end > row->data_len ? end - row->data_len : 0, SPACE_METADATA);
        if (row->has_data && row->data_len > 0)
                needed += STORE_BLOCK_SIZE; /* block 0 takes the inline bytes */
        for (uint64_t idx = offset / STORE_BLOCK_SIZE; idx <= (end - 1) / STORE_BLOCK_SIZE; idx++)
                if (!dirty_find(v, row->ino, idx))
                        needed += STORE_BLOCK_SIZE;
        return space_check(v->store, needed, SPACE_DATA);
}

static int data_write(Volume *v, uint64_t ino, const void *buf, size_t size, uint64_t offset) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        _cleanup_free_ uint64_t *fresh = NULL;
        uint64_t end = offset + size;
        uint64_t old_size;
        size_t n_fresh = 0;
        bool to_blocks;
        int r;

        r = inode_get_for_write(v, ino, &row);
        if (r < 0)
                return r;
        if (S_ISDIR(row.mode))
                return -EISDIR;
        if (!S_ISREG(row.mode))
                return -EINVAL;
        if (size == 0)
                return 0;
        old_size = row.size;

        r = volume_check_quota(v, end > row.size ? end - row.size : 0);
        if (r < 0)
                return r;
        r = write_check_space(v, &row, offset, end);
        if (r < 0)
                return r;

        /* The blocks change last, once nothing can fail: they are not
         * rolled back with the layer. */
        to_blocks = !(row.has_data && end <= INLINE_MAX);
        if (!to_blocks) {
                r = inline_resize(&row, (size_t) MAX(end, (uint64_t) row.data_len));
                if (r < 0)
                        return r;
                memcpy(row.data + offset, buf, size);
        } else {
                if (row.has_data) {
                        r = inline_to_blocks(v, &row);
                        if (r < 0)
                                return r;
                }
                fresh = calloc((end - 1) / STORE_BLOCK_SIZE - offset / STORE_BLOCK_SIZE + 1, sizeof *fresh);
                if (!fresh)
                        return -ENOMEM;
                r = blocks_prepare(v, &row, size, offset, fresh, &n_fresh);
                if (r < 0)
                        goto fail;
        }

        row.size = MAX(row.size, end);
        row.mtime_ns = row.ctime_ns = timestamp_now();
        r = inode_put(v, &row);
        if (r < 0)
                goto fail;
        if (to_blocks)
                blocks_copy_in(v, ino, buf, size, offset);
        logical_size_changed(v, &row, old_size, row.size);
        return 0;
fail:
        for (size_t i = 0; i < n_fresh; i++)
                data_forget_dirty_one(v, ino, fresh[i]);
        return r;
}

/* How long a write waits for the kernel to forget removed files before it
 * fails with EDQUOT. */
#define QUOTA_FORGET_WAIT_USEC (1000 * 1000)

/* The kernel tells us that it forgot a removed file some time after the
 * unlink returned, and a FORGET may come after requests made later: 'rm'
 * and then a write that needs the space it gave back found the quota still
 * full. A write that only such files keep over the quota waits a moment
 * for them, before anything changes. Caller holds the volume's lock; the
 * wait lets it go, and before_wait has another thread of the server read
 * its device, so that the FORGET is taken. */
static void quota_wait_for_orphans(Volume *v, uint64_t ino, uint64_t end) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        struct timespec deadline;
        uint64_t growth;

        /* The file grows by at most end. */
        if (v->orphan_bytes == 0 || !quota_passed(v, v->orphan_bytes, end))
                return;
        if (inode_get(v, ino, &row) < 0 || row.nlink == 0)
                return;
        growth = end > row.size ? end - row.size : 0;
        if (quota_passed(v, 0, growth))
                return;         /* over the quota whatever comes */
        if (v->before_wait)
                v->before_wait();
        /* v->orphans_gone waits on CLOCK_MONOTONIC. */
        deadline = timespec_from_usec(monotonic_usec() + QUOTA_FORGET_WAIT_USEC);
        while (v->orphan_bytes > 0 && quota_passed(v, v->orphan_bytes, growth) && !quota_passed(v, 0, growth))
                if (pthread_cond_timedwait(&v->orphans_gone, &v->lock, &deadline) == ETIMEDOUT)
                        return;
}

ssize_t volume_write(Volume *v, uint64_t ino, const void *buf, size_t size, uint64_t offset) {
        TopChange change;
        int r;

        if (offset + size < offset || offset + size > (uint64_t) INT64_MAX)
                return -EFBIG;

        MUTEX_LOCKED(&v->lock);
        quota_wait_for_orphans(v, ino, offset + size);
        r = top_change_begin(v, &change);
        r = top_change_end(v, &change, r ?: data_write(v, ino, buf, size, offset));
        if (r < 0)
                return r;

        if (v->n_dirty >= v->flush_ahead_at && !v->flush_ahead_wanted && v->committer_running) {
                v->flush_ahead_wanted = true;
                pthread_cond_signal(&v->wake);
        }
        if (v->n_dirty > (space_low(v->store) ? DIRTY_LOW_SPACE : DIRTY_MAX)) {
                int failed;

                r = data_flush_all(v, ino, &failed);
                if (r >= 0)
                        r = failed;
                if (r < 0)
                        return r;
        }
        return (ssize_t) size;
}

/* Ranges of more blocks than this are not walked block by block: the
 * blocks of the file that may hold data are listed instead, so that a hole
 * punched in, or cloned into, a sparse file of terabytes costs its few
 * blocks and not its size. */
#define RANGE_WALK_BLOCKS_MAX 1024

static int data_candidate_blocks(Volume *v, uint64_t ino, uint64_t first, uint64_t n_blocks, uint64_t **ret,
                                 size_t *ret_n);

static int block_zero(Volume *v, uint64_t ino, uint64_t idx) {
        int r;

        r = extent_put(v, ino, idx, NULL, 0, 0);
        if (r >= 0 && data_forget_dirty_one(v, ino, idx))
                v->memory_changes++;
        return r;
}

/* Zeroes [offset, offset + length) of a block file within its size: whole
 * blocks become holes, partial ones are rewritten. The partial ones are
 * read first: a damaged one fails the call before anything changed. */
static int blocks_zero_range(Volume *v, const InodeRow *row, uint64_t offset, uint64_t length) {
        uint64_t end = MIN(offset + length, row->size);
        uint64_t first = DIV_ROUND_UP(offset, STORE_BLOCK_SIZE), last = end / STORE_BLOCK_SIZE;
        _cleanup_free_ uint64_t *candidates = NULL;
        size_t n_candidates = 0;
        bool listed = false;
        int r;

        if (last > first && last - first > RANGE_WALK_BLOCKS_MAX) {
                r = data_candidate_blocks(v, row->ino, first, last, &candidates, &n_candidates);
                if (r < 0)
                        return r;
                listed = true;
        }

        for (int pass = 0; pass < 2; pass++)
                for (uint64_t pos = offset; pos < end;) {
                        uint64_t idx = pos / STORE_BLOCK_SIZE;
                        size_t in_block = (size_t) (pos % STORE_BLOCK_SIZE);
                        size_t n = (size_t) MIN(end - pos, (uint64_t) STORE_BLOCK_SIZE - in_block);
                        DirtyBlock *b;

                        r = 0;
                        if (n < STORE_BLOCK_SIZE) {
                                r = dirty_get(v, row, idx, true, &b);
                                if (r >= 0 && pass == 1)
                                        dirty_zero(v, b, in_block, n);
                        } else if (listed) {
                                /* The whole blocks at once: those with no
                                 * data in any layer are holes already. */
                                for (size_t i = 0; pass == 1 && r >= 0 && i < n_candidates; i++)
                                        r = block_zero(v, row->ino, candidates[i]);
                                if (r < 0)
                                        return r;
                                pos = last * STORE_BLOCK_SIZE;
                                continue;
                        } else if (pass == 1)
                                r = block_zero(v, row->ino, idx);
                        if (r < 0)
                                return r;
                        pos += n;
                }
        return 0;
}

int data_truncate(Volume *v, InodeRow *row, uint64_t size) {
        uint64_t old_size = row->size;
        int r;

        if (size > (uint64_t) INT64_MAX)
                return -EFBIG;
        if (row->has_data) {
                if (size <= INLINE_MAX) {
                        r = inline_resize(row, (size_t) size);
                        if (r < 0)
                                return r;
                } else {
                        r = inline_to_blocks(v, row);
                        if (r < 0)
                                return r;
                }
        } else if (size < old_size) {
                uint64_t keep = DIV_ROUND_UP(size, STORE_BLOCK_SIZE);
                size_t from = (size_t) (size % STORE_BLOCK_SIZE);
                DirtyBlock *partial = NULL;

                /* What can fail first, the blocks in memory last. */
                if (from != 0) {
                        r = dirty_get(v, row, size / STORE_BLOCK_SIZE, true, &partial);
                        if (r < 0)
                                return r;
                }
                r = extents_delete_from(v, row->ino, keep);
                if (r < 0)
                        return r;
                data_forget_dirty(v, row->ino, keep, old_size);
                if (partial)
                        dirty_zero(v, partial, from, STORE_BLOCK_SIZE - from);
                row->lower_limit = MIN(row->lower_limit, size);
        }
        row->size = size;
        logical_size_changed(v, row, old_size, size);
        return 0;
}

static int data_allocate(Volume *v, uint64_t ino, int mode, uint64_t offset, uint64_t length) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
        uint64_t end = offset + length;
        int r;

        r = inode_get_for_write(v, ino, &row);
        if (r < 0)
                return r;
        if (S_ISDIR(row.mode))
                return -EISDIR;
        if (!S_ISREG(row.mode))
                return -ENODEV;

        if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
                if (row.has_data) {
                        if (offset < row.data_len)
                                memset(row.data + offset, 0, (size_t) MIN(length, row.data_len - offset));
                } else {
                        r = blocks_zero_range(v, &row, offset, length);
                        if (r < 0)
                                return r;
                }
        }
        /* Space is not reserved ahead in a copy-on-write store: allocation
         * only sets the size. */
        if (!keep_size && end > row.size) {
                r = volume_check_quota(v, end - row.size);
                if (r < 0)
                        return r;
                r = data_truncate(v, &row, end);
                if (r < 0)
                        return r;
        }
        row.mtime_ns = row.ctime_ns = timestamp_now();
        return inode_put(v, &row);
}

int volume_fallocate(Volume *v, uint64_t ino, int mode, uint64_t offset, uint64_t length) {
        bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
        TopChange change;
        int r;

        if (length == 0 || offset + length < offset || offset + length > (uint64_t) INT64_MAX)
                return -EINVAL;
        if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
                return -EOPNOTSUPP;
        if ((mode & FALLOC_FL_PUNCH_HOLE) && (!keep_size || (mode & FALLOC_FL_ZERO_RANGE)))
                return -EOPNOTSUPP;

        MUTEX_LOCKED(&v->lock);
        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: data_allocate(v, ino, mode, offset, length));
}

/* Block indexes already counted, so that a block an upper layer (or a
 * dirty one) has hides a lower layer's at the same index. A bit a block
 * for a file of up to 512 GiB; past that, the indexes found, since a size
 * may be 2^63 - 1: those of earlier layers sorted, a layer's own appended
 * after them (a layer holds each index once) and sorted in when it is
 * done. */
#define COUNTED_BITMAP_BLOCKS_MAX (UINT64_C(8) << 20)

typedef struct CountedBlocks {
        uint8_t *bitmap;
        uint64_t *idx;
        size_t n, n_sorted, size;
} CountedBlocks;

static int counted_init(CountedBlocks *c, uint64_t n_blocks) {
        *c = (CountedBlocks) {};
        if (n_blocks > COUNTED_BITMAP_BLOCKS_MAX)
                return 0;
        c->bitmap = calloc(DIV_ROUND_UP(n_blocks, 8), 1);
        return c->bitmap ? 0 : -ENOMEM;
}

static void counted_done(CountedBlocks *c) {
        free(c->bitmap);
        free(c->idx);
}

static int u64_compare(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

static bool counted_has(const CountedBlocks *c, uint64_t idx) {
        if (c->bitmap)
                return c->bitmap[idx / 8] & (1u << (idx % 8));
        return c->n_sorted > 0 && bsearch(&idx, c->idx, c->n_sorted, sizeof *c->idx, u64_compare);
}

static int counted_add(CountedBlocks *c, uint64_t idx) {
        if (c->bitmap) {
                c->bitmap[idx / 8] |= (uint8_t) (1u << (idx % 8));
                return 0;
        }
        if (c->n == c->size) {
                size_t size = MAX(c->size * 2, (size_t) 64);
                uint64_t *p = reallocarray(c->idx, size, sizeof *p);

                if (!p)
                        return -ENOMEM;
                c->idx = p;
                c->size = size;
        }
        c->idx[c->n++] = idx;
        return 0;
}

static void counted_settle(CountedBlocks *c) {
        if (c->n > c->n_sorted)
                qsort(c->idx, c->n, sizeof *c->idx, u64_compare);
        c->n_sorted = c->n;
}

/* Calls fn with the index of each dirty block of ino below n_blocks: a
 * small file's blocks are looked up, a large one's found among all dirty
 * blocks. */
typedef int (*dirty_block_fn)(uint64_t idx, void *userdata);

static int dirty_blocks_foreach(Volume *v, uint64_t ino, uint64_t n_blocks, dirty_block_fn fn, void *userdata) {
        int r;

        if (v->n_dirty == 0)
                return 0;
        if (n_blocks <= DIRTY_LOOKUP_BLOCKS) {
                for (uint64_t idx = 0; idx < n_blocks; idx++)
                        if (dirty_find(v, ino, idx) && (r = fn(idx, userdata)) < 0)
                                return r;
                return 0;
        }
        for (size_t h = 0; h < DIRTY_BUCKETS; h++)
                for (DirtyBlock *b = v->dirty[h]; b; b = b->next)
                        if (b->ino == ino && b->idx < n_blocks && (r = fn(b->idx, userdata)) < 0)
                                return r;
        return 0;
}

typedef struct DirtyCount {
        CountedBlocks *counted;
        uint64_t n;
} DirtyCount;

static int count_dirty_block(uint64_t idx, void *userdata) {
        DirtyCount *c = userdata;

        c->n++;
        return counted_add(c->counted, idx);
}

uint64_t data_allocated_bytes(Volume *v, const InodeRow *row) {
        uint64_t n_blocks, total = 0, limit = LOWER_LIMIT_NONE;
        CountedBlocks counted;
        int r;

        if (row->has_data)
                return row->data_len;
        n_blocks = DIV_ROUND_UP(row->size, STORE_BLOCK_SIZE);
        if (n_blocks == 0)
                return 0;
        r = counted_init(&counted, n_blocks);
        if (r >= 0) {
                DirtyCount dirty = { .counted = &counted };

                r = dirty_blocks_foreach(v, row->ino, n_blocks, count_dirty_block, &dirty);
                total += dirty.n * STORE_BLOCK_SIZE;
        }
        counted_settle(&counted);

        for (size_t i = 0; r >= 0 && i < v->n_layers && limit > 0; i++) {
                sqlite3_stmt *st = v->layers[i].list_extents;
                sqlite3_stmt *gi = v->layers[i].get_inode;

                if (!layer_may_have(&v->layers[i], row->ino))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) row->ino);
                sqlite3_bind_int64(st, 2, 0);
                while (r >= 0 && sqlite3_step(st) == SQLITE_ROW) {
                        uint64_t idx = (uint64_t) sqlite3_column_int64(st, 0);

                        if (idx >= n_blocks || idx * STORE_BLOCK_SIZE >= limit || counted_has(&counted, idx))
                                continue;
                        r = counted_add(&counted, idx);
                        if (sqlite3_column_type(st, 1) != SQLITE_NULL)
                                total += (uint64_t) sqlite3_column_int64(st, 2);
                }
                sqlite3_reset(st);
                counted_settle(&counted);

                sqlite3_bind_int64(gi, 1, (sqlite3_int64) row->ino);
                if (sqlite3_step(gi) == SQLITE_ROW)
                        limit = MIN(limit, sqlite3_column_type(gi, 11) != SQLITE_NULL
                                                   ? 0 : (uint64_t) sqlite3_column_int64(gi, 10));
                sqlite3_reset(gi);
        }
        counted_done(&counted);
        if (r < 0)
                return row->size;       /* out of memory: an estimate that is never too small */
        return MIN(total, DIV_ROUND_UP(row->size, 4096) * 4096);
}

/* What block idx of a file is, as stored: its digest, or a hole. 0 if the
 * answer is "copy it instead" (inline content, a dirty block). */
static int clone_source_block(Volume *src, uint64_t ino, uint64_t idx, Digest *ret_digest,
                              uint32_t *ret_len, bool *ret_hole) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        int r;

        MUTEX_LOCKED(&src->lock);
        r = inode_get(src, ino, &row);
        if (r < 0)
                return r;
        if (!S_ISREG(row.mode))
                return -EINVAL;
        if (row.has_data || dirty_find(src, ino, idx))
                return 0;
        r = extent_get(src, &row, idx, ret_digest, ret_len, ret_hole);
        if (r < 0)
                return r;
        return 1;
}

/* Puts a block that src stores into dst's file at block idx, covering
 * length bytes from the block's start. 0 if it must be copied instead. */
static int clone_put_block(Volume *dst, uint64_t ino, uint64_t idx, uint64_t length,
                           const Digest *d, uint32_t len, bool hole) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        uint64_t end = idx * STORE_BLOCK_SIZE + length, old_size;
        BlockLocation loc = {};
        int r;

        r = inode_get_for_write(dst, ino, &row);
        if (r < 0)
                return r;
        if (!S_ISREG(row.mode))
                return -EINVAL;
        /* A short block replaces the whole block: only where nothing of the
         * file lies past it. */
        if (length < STORE_BLOCK_SIZE && row.size > end)
                return 0;
        old_size = row.size;

        r = volume_check_quota(dst, end > row.size ? end - row.size : 0);
        if (r < 0)
                return r;
        r = space_check(dst->store, 256, SPACE_METADATA);
        if (r < 0)
                return r;

        if (!hole) {
                /* The block stays referenced by src; until dst's reference
                 * is committed, the shared GC lock keeps the reaper off it. */
                if (dst->gc_fd < 0) {
                        r = gc_lock_shared(dst->store, &dst->gc_fd);
                        if (r < 0)
                                return r;
                }
                r = block_lookup(dst->store, d, &loc);
                if (r == -ENOENT)
                        return 0;
                if (r < 0)
                        return r;
        }

        if (row.has_data) {
                r = inline_to_blocks(dst, &row);
                if (r < 0)
                        return r;
        }
        r = extent_put(dst, ino, idx, hole ? NULL : d, MIN(len, (uint32_t) length), loc.stored_len);
        if (r < 0)
                return r;

        row.size = MAX(row.size, end);
        row.mtime_ns = row.ctime_ns = timestamp_now();
        r = inode_put(dst, &row);
        if (r < 0)
                return r;
        if (data_forget_dirty_one(dst, ino, idx))
                dst->memory_changes++;
        logical_size_changed(dst, &row, old_size, row.size);
        return 1;
}

static int clone_share_block(Volume *dst, uint64_t ino, uint64_t idx, uint64_t length,
                             const Digest *d, uint32_t len, bool hole) {
        TopChange change;
        int r;

        MUTEX_LOCKED(&dst->lock);
        r = top_change_begin(dst, &change);
        return top_change_end(dst, &change, r ?: clone_put_block(dst, ino, idx, length, d, len, hole));
}

static int clone_copy(Volume *dst, uint64_t dst_ino, uint64_t dst_offset,
                      Volume *src, uint64_t src_ino, uint64_t src_offset, size_t n, uint8_t *buf) {
        ssize_t k;

        k = volume_read(src, src_ino, buf, n, src_offset);
        if (k < 0)
                return (int) k;
        if ((size_t) k != n)
                return -EINVAL;
        k = volume_write(dst, dst_ino, buf, n, dst_offset);
        if (k < 0)
                return (int) k;
        return 0;
}

/* Makes [offset, offset + length) of dst's file read as zeros, and the
 * file at least that long: where the source of a clone is a hole. */
static int clone_zero(Volume *dst, uint64_t ino, uint64_t offset, uint64_t length) {
        TopChange change;
        int r;

        MUTEX_LOCKED(&dst->lock);
        r = top_change_begin(dst, &change);
        return top_change_end(dst, &change, r ?: data_allocate(dst, ino, FALLOC_FL_PUNCH_HOLE, offset, length));
}

/* The blocks from first and below n_blocks of a clone's source that may
 * hold data; *ret_listed is false when its content is inline, all of it
 * data. */
static int clone_source_candidates(Volume *src, uint64_t ino, uint64_t first, uint64_t n_blocks, uint64_t **ret,
                                   size_t *ret_n, bool *ret_listed) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        int r;

        MUTEX_LOCKED(&src->lock);
        r = inode_get(src, ino, &row);
        if (r < 0)
                return r;
        *ret_listed = !row.has_data;
        if (row.has_data)
                return 0;
        return data_candidate_blocks(src, ino, first, n_blocks, ret, ret_n);
}

int volume_clone_range(Volume *dst, uint64_t dst_ino, uint64_t dst_offset,
                       Volume *src, uint64_t src_ino, uint64_t src_offset, uint64_t length) {
        _cleanup_free_ uint64_t *candidates = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t n_candidates = 0, c = 0;
        bool listed = false;
        struct stat src_st;
        int r;

        if (dst->store != src->store)
                return -EXDEV;
        if (!dst->writable)
                return -EROFS;
        if (src_offset + length < src_offset || dst_offset + length < dst_offset ||
            dst_offset + length > (uint64_t) INT64_MAX)
                return -EFBIG;
        if (src == dst && src_ino == dst_ino &&
            src_offset < dst_offset + length && dst_offset < src_offset + length)
                return -EINVAL;

        r = volume_getattr(src, src_ino, &src_st);
        if (r < 0)
                return r;
        if (!S_ISREG(src_st.st_mode))
                return S_ISDIR(src_st.st_mode) ? -EISDIR : -EINVAL;
        if (src_offset + length > (uint64_t) src_st.st_size)
                return -EINVAL;

        buf = malloc(STORE_BLOCK_SIZE);
        if (!buf)
                return -ENOMEM;
        if (length / STORE_BLOCK_SIZE > RANGE_WALK_BLOCKS_MAX) {
                r = clone_source_candidates(src, src_ino, src_offset / STORE_BLOCK_SIZE,
                                            DIV_ROUND_UP(src_offset + length, STORE_BLOCK_SIZE),
                                            &candidates, &n_candidates, &listed);
                if (r < 0)
                        return r;
        }

        for (uint64_t pos = 0; pos < length;) {
                uint64_t so = src_offset + pos, doff = dst_offset + pos;
                size_t n = (size_t) MIN(length - pos, (uint64_t) STORE_BLOCK_SIZE - doff % STORE_BLOCK_SIZE);
                bool aligned = so % STORE_BLOCK_SIZE == 0 && doff % STORE_BLOCK_SIZE == 0;

                while (listed && c < n_candidates && candidates[c] < so / STORE_BLOCK_SIZE)
                        c++;
                if (listed && (c == n_candidates || candidates[c] > so / STORE_BLOCK_SIZE)) {
                        /* No layer has data in this block of the source: it
                         * reads as zeros up to the next block that may. */
                        uint64_t next = c < n_candidates ? candidates[c] * STORE_BLOCK_SIZE : src_offset + length;
                        uint64_t zeros = MIN(next, src_offset + length) - so;

                        r = clone_zero(dst, dst_ino, doff, zeros);
                        if (r < 0)
                                return r;
                        pos += zeros;
                        continue;
                }

                if (aligned && (n == STORE_BLOCK_SIZE || so + n == (uint64_t) src_st.st_size)) {
                        Digest d;
                        uint32_t len = 0;
                        bool hole = true;

                        r = clone_source_block(src, src_ino, so / STORE_BLOCK_SIZE, &d, &len, &hole);
                        if (r > 0)
                                r = clone_share_block(dst, dst_ino, doff / STORE_BLOCK_SIZE, n, &d, len, hole);
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                pos += n;
                                continue;
                        }
                } else if (!aligned)
                        n = (size_t) MIN((uint64_t) n, (uint64_t) STORE_BLOCK_SIZE - so % STORE_BLOCK_SIZE);

                r = clone_copy(dst, dst_ino, doff, src, src_ino, so, n, buf);
                if (r < 0)
                        return r;
                pos += n;
        }
        return 0;
}

/* The block indexes from first and below n_blocks that may hold data: the
 * dirty ones, and those that any layer has a row of; the rest of the file
 * is holes. Sorted, each once; the rows of a layer before first are not
 * read. */
typedef struct BlockList {
        uint64_t *idx;
        size_t n, allocated;
} BlockList;

static int block_list_add(uint64_t idx, void *userdata) {
        BlockList *l = userdata;

        if (!GREEDY_REALLOC(l->idx, l->allocated, l->n + 1))
                return -ENOMEM;
        l->idx[l->n++] = idx;
        return 0;
}

static int data_candidate_blocks(Volume *v, uint64_t ino, uint64_t first, uint64_t n_blocks, uint64_t **ret,
                                 size_t *ret_n) {
        _cleanup_free_ uint64_t *idx = NULL;
        BlockList list = {};
        size_t n, kept = 0;
        int r;

        r = dirty_blocks_foreach(v, ino, n_blocks, block_list_add, &list);
        for (size_t l = 0; r >= 0 && l < v->n_layers; l++) {
                sqlite3_stmt *st = v->layers[l].list_extents;

                if (!layer_may_have(&v->layers[l], ino))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
                sqlite3_bind_int64(st, 2, (sqlite3_int64) first);
                while ((r = sqlite_step_row(st)) > 0) {
                        uint64_t i = (uint64_t) sqlite3_column_int64(st, 0);

                        if (i >= n_blocks)
                                break;  /* in order: the rest lie past the end too */
                        r = block_list_add(i, &list);
                        if (r < 0)
                                break;
                }
                sqlite3_reset(st);
        }
        idx = list.idx;
        n = list.n;
        if (r < 0)
                return r;
        if (n > 0)
                qsort(idx, n, sizeof *idx, u64_compare);
        for (size_t i = 0; i < n; i++)
                if (idx[i] >= first && (kept == 0 || idx[kept - 1] != idx[i]))
                        idx[kept++] = idx[i];
        *ret = TAKE_PTR(idx);
        *ret_n = kept;
        return 0;
}

int volume_file_extents(Volume *v, uint64_t ino, VolumeExtent **ret, size_t *ret_n) {
        _cleanup_(inode_row_clear) InodeRow row = {};
        _cleanup_free_ VolumeExtent *extents = NULL;
        _cleanup_free_ uint64_t *candidates = NULL;
        size_t n_candidates = 0, n = 0;
        int r;

        MUTEX_LOCKED(&v->lock);
        r = inode_get(v, ino, &row);
        if (r < 0)
                return r;
        if (!S_ISREG(row.mode))
                return S_ISDIR(row.mode) ? -EISDIR : -EINVAL;
        if (row.has_data)
                return -ENODATA;

        /* A sparse file of terabytes lists its few blocks, not its size. */
        r = data_candidate_blocks(v, ino, 0, DIV_ROUND_UP(row.size, STORE_BLOCK_SIZE), &candidates, &n_candidates);
        if (r < 0)
                return r;
        extents = calloc(MAX(n_candidates, 1u), sizeof *extents);
        if (!extents)
                return -ENOMEM;
        for (size_t i = 0; i < n_candidates; i++) {
                uint64_t idx = candidates[i];
                VolumeExtent *e = &extents[n];
                Digest d;
                uint32_t len;
                bool hole;

                e->offset = idx * STORE_BLOCK_SIZE;
                e->length = (uint32_t) MIN((uint64_t) STORE_BLOCK_SIZE, row.size - e->offset);
                if (dirty_find(v, ino, idx)) {
                        e->unsettled = true;
                        n++;
                        continue;
                }
                r = extent_get(v, &row, idx, &d, &len, &hole);
                if (r < 0)
                        return r;
                if (hole)
                        continue;       /* a row that says so, or one cut off above */
                memcpy(e->digest, d.bytes, sizeof e->digest);
                /* Bytes past the stored length read as zeros: a
                 * different content than the block's alone. */
                if (len < e->length)
                        e->unsettled = true;
                n++;
        }
        *ret = TAKE_PTR(extents);
        *ret_n = n;
        return 0;
}

int volume_read_block_zstd(Volume *v, const uint8_t digest[16], void *buf, size_t *ret_len) {
        Digest d;

        memcpy(d.bytes, digest, sizeof d.bytes);
        return block_read_stored_zstd(v->store, &d, buf, ret_len);
}
