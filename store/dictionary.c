/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The store's compression dictionary. A small file compressed alone leaves
 * most of what zstd could find in it unfound: its words and phrases are
 * those of its neighbours, not its own. So once the store has seen enough
 * small contents (SAMPLE_BYTES), it trains a zstd dictionary on them, keeps
 * it in the catalog for good, and compresses small files and short blocks
 * with it: on source trees they take a third less space.
 *
 * A frame made with a dictionary names it (its zstd dictionary ID), so
 * decompression finds the dictionary it needs and nothing else records
 * which was used. A dictionary is committed to the catalog before any frame
 * that uses it is written, and never removed.
 *
 * The lock of the dictionaries is a leaf: nothing else is locked while it
 * is held, so that compression may run under any other lock. The first
 * compression after the store is opened reads the dictionary, taking the
 * catalog's lock: compression runs under the volume's or the packs' lock,
 * both taken before the catalog's, never the other way round.
 */

#include <errno.h>
#include <zdict.h>

#include "alloc-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "xxhash-util.h"

#define DICTIONARY_SIZE_MAX (64 * 1024)
#define SAMPLE_BYTES (2 * 1024 * 1024)  /* trained once this much was offered */
#define SAMPLE_SIZE_MIN 64

typedef struct Samples {
        uint8_t *bytes;         /* offered contents, back to back */
        size_t len;
        size_t *sizes;
        size_t n, allocated;
} Samples;

typedef struct LoadedDictionary {
        unsigned id;
        ZSTD_DDict *ddict;
} LoadedDictionary;

struct Dictionaries {
        pthread_mutex_t lock;
        ZSTD_CDict *cdict;      /* for compressing; NULL until there is one */
        bool unread;            /* the catalog has one, not yet read into cdict */
        LoadedDictionary *loaded;
        size_t n_loaded, allocated_loaded;

        Samples samples;
        bool done;              /* trained, tried, or given up: no more samples */
};

static void samples_clear(Samples *x) {
        free(x->bytes);
        free(x->sizes);
        *x = (Samples) {};
}

/* Reads a dictionary from the catalog: the one with the given ID, or with
 * id 0 the store's first. -ENOENT if there is none. */
static int dictionary_read(Store *s, unsigned id, void **ret, size_t *ret_len, unsigned *ret_id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const void *content;
        size_t len;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog,
                           id ? "SELECT dict_id, content, content_check FROM dictionaries WHERE dict_id = ?1"
                              : "SELECT dict_id, content, content_check FROM dictionaries ORDER BY created_usec LIMIT 1",
                           &st);
        if (r < 0)
                return r;
        if (id)
                sqlite3_bind_int64(st, 1, id);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -ENOENT;
        content = sqlite3_column_blob(st, 1);
        len = (size_t) sqlite3_column_bytes(st, 1);
        if (!content || XXH3_64bits(content, len) != (uint64_t) sqlite3_column_int64(st, 2)) {
                block_count_corruption(s);
                return -EIO;
        }
        *ret = malloc(MAX(len, 1u));
        if (!*ret)
                return -ENOMEM;
        memcpy(*ret, content, len);
        *ret_len = len;
        if (ret_id)
                *ret_id = (unsigned) sqlite3_column_int64(st, 0);
        return 0;
}

static int dictionary_exists(Store *s) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT 1 FROM dictionaries LIMIT 1", &st);
        if (r < 0)
                return r;
        return sqlite_step_row(st);
}

int dictionaries_new(Store *s, struct Dictionaries **ret) {
        _cleanup_free_ struct Dictionaries *d = NULL;
        int r;

        d = calloc(1, sizeof *d);
        if (!d)
                return -ENOMEM;
        /* Read and made into a CDict at the first compression: its pages,
         * the copy and the CDict cost milliseconds, and most opens of a
         * store never compress. */
        r = dictionary_exists(s);
        if (r < 0)
                return r;
        d->unread = d->done = r > 0;
        pthread_mutex_init(&d->lock, NULL);
        *ret = TAKE_PTR(d);
        return 0;
}

struct Dictionaries *dictionaries_free(struct Dictionaries *d) {
        if (!d)
                return NULL;
        ZSTD_freeCDict(d->cdict);
        for (size_t i = 0; i < d->n_loaded; i++)
                ZSTD_freeDDict(d->loaded[i].ddict);
        free(d->loaded);
        samples_clear(&d->samples);
        pthread_mutex_destroy(&d->lock);
        free(d);
        return NULL;
}

/* Reads the stored dictionary into a CDict. Outside the lock, a leaf:
 * reading takes the catalog's. Two threads may both make one; the first
 * kept is the one. */
static ZSTD_CDict *cdict_load(Store *s) {
        struct Dictionaries *d = s->dicts;
        _cleanup_free_ void *dict = NULL;
        ZSTD_CDict *cdict;
        size_t len = 0;
        int r;

        r = dictionary_read(s, 0, &dict, &len, NULL);
        if (r < 0) {
                /* Damaged: its files give EIO, new ones are compressed
                 * alone. Anything else, such as no memory: this compression
                 * goes without it, the next tries again. */
                if (r == -EIO) {
                        MUTEX_LOCKED(&d->lock);
                        d->unread = false;
                }
                return NULL;
        }
        cdict = ZSTD_createCDict(dict, len, STORE_ZSTD_LEVEL);
        if (!cdict)
                return NULL;

        MUTEX_LOCKED(&d->lock);
        if (d->cdict)
                ZSTD_freeCDict(cdict);
        else
                d->cdict = cdict;
        d->unread = false;
        return d->cdict;
}

const ZSTD_CDict *dictionary_for_compression(Store *s) {
        struct Dictionaries *d = s->dicts;

        {
                MUTEX_LOCKED(&d->lock);
                if (d->cdict || !d->unread)
                        return d->cdict;
        }
        return cdict_load(s);
}

/* Stores a trained dictionary, unless another process stored one first:
 * then that one is the store's. Returns the one to use. */
static int dictionary_store(Store *s, const void *dict, size_t len, void **ret, size_t *ret_len) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        {
                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog,
                                   "INSERT INTO dictionaries(dict_id, content, content_check, created_usec) "
                                   "SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (SELECT 1 FROM dictionaries)",
                                   &st);
                if (r < 0)
                        return r;
                sqlite3_bind_int64(st, 1, ZDICT_getDictID(dict, len));
                sqlite3_bind_blob(st, 2, dict, (int) len, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, (sqlite3_int64) XXH3_64bits(dict, len));
                sqlite3_bind_int64(st, 4, (sqlite3_int64) now_usec());
                r = sqlite_step_done(st);
                if (r < 0)
                        return r;
        }
        /* Committed (the catalog is in autocommit here) before any frame
         * that uses it can be written. */
        return dictionary_read(s, 0, ret, ret_len, NULL);
}

static ZSTD_CDict *train(Store *s, const Samples *x) {
        _cleanup_free_ void *dict = NULL, *chosen = NULL;
        size_t len, chosen_len = 0;

        dict = malloc(DICTIONARY_SIZE_MAX);
        if (!dict)
                return NULL;
        len = ZDICT_trainFromBuffer(dict, DICTIONARY_SIZE_MAX, x->bytes, x->sizes, (unsigned) x->n);
        if (ZDICT_isError(len) || ZDICT_getDictID(dict, len) == 0)
                return NULL; /* too few or too alike samples */
        if (dictionary_store(s, dict, len, &chosen, &chosen_len) < 0)
                return NULL;
        return ZSTD_createCDict(chosen, chosen_len, STORE_ZSTD_LEVEL);
}

/* Adds a sample; returns the samples once there are enough to train on. */
static bool sample_add(struct Dictionaries *d, const void *data, size_t len, Samples *ret) {
        Samples *x = &d->samples;
        uint8_t *bytes;

        MUTEX_LOCKED(&d->lock);
        if (d->done)
                return false;
        bytes = GREEDY_REALLOC(x->sizes, x->allocated, x->n + 1) ? realloc(x->bytes, x->len + len) : NULL;
        if (!bytes) {
                d->done = true;
                samples_clear(x);
                return false;
        }
        x->bytes = bytes;
        memcpy(x->bytes + x->len, data, len);
        x->len += len;
        x->sizes[x->n++] = len;
        if (x->len < SAMPLE_BYTES)
                return false;
        d->done = true; /* once, whatever the outcome */
        *ret = *x;
        *x = (Samples) {};
        return true;
}

void dictionary_offer_sample(Store *s, const void *data, size_t len) {
        struct Dictionaries *d = s->dicts;
        Samples x;
        ZSTD_CDict *cdict;

        if (len < SAMPLE_SIZE_MIN || !sample_add(d, data, len, &x))
                return;
        /* Trained outside the lock: storing it takes the catalog's. */
        cdict = train(s, &x);
        samples_clear(&x);
        MUTEX_LOCKED(&d->lock);
        d->cdict = cdict;
}

static const ZSTD_DDict *ddict_find(struct Dictionaries *d, unsigned id) {
        MUTEX_LOCKED(&d->lock);
        for (size_t i = 0; i < d->n_loaded; i++)
                if (d->loaded[i].id == id)
                        return d->loaded[i].ddict;
        return NULL;
}

/* Keeps a loaded dictionary, or frees it for the one another thread kept
 * meanwhile. */
static const ZSTD_DDict *ddict_keep(struct Dictionaries *d, unsigned id, ZSTD_DDict *ddict) {
        MUTEX_LOCKED(&d->lock);
        for (size_t i = 0; i < d->n_loaded; i++)
                if (d->loaded[i].id == id) {
                        ZSTD_freeDDict(ddict);
                        return d->loaded[i].ddict;
                }
        if (!GREEDY_REALLOC(d->loaded, d->allocated_loaded, d->n_loaded + 1)) {
                ZSTD_freeDDict(ddict);
                return NULL;
        }
        d->loaded[d->n_loaded++] = (LoadedDictionary) { .id = id, .ddict = ddict };
        return ddict;
}

/* The decompression form of dictionary id, loaded once and kept until the
 * store is closed. */
static int ddict_get(Store *s, unsigned id, const ZSTD_DDict **ret) {
        _cleanup_free_ void *dict = NULL;
        ZSTD_DDict *ddict;
        size_t len = 0;
        int r;

        *ret = ddict_find(s->dicts, id);
        if (*ret)
                return 0;
        r = dictionary_read(s, id, &dict, &len, NULL);
        if (r == -ENOENT) {
                block_count_corruption(s); /* a frame names a dictionary nobody stored */
                return -EIO;
        }
        if (r < 0)
                return r;
        ddict = ZSTD_createDDict(dict, len);
        if (!ddict)
                return -ENOMEM;
        *ret = ddict_keep(s->dicts, id, ddict);
        return *ret ? 0 : -ENOMEM;
}

size_t zstd_compress_small(Store *s, ZSTD_CCtx *cctx, void *dst, size_t cap, const void *src, size_t len, int level) {
        const ZSTD_CDict *cdict = dictionary_for_compression(s);

        if (cdict)
                return ZSTD_compress_usingCDict(cctx, dst, cap, src, len, cdict);
        return ZSTD_compressCCtx(cctx, dst, cap, src, len, level);
}

int zstd_decompress(Store *s, ZSTD_DCtx *dctx, void *dst, size_t cap, const void *src, size_t len, size_t *ret) {
        unsigned id = ZSTD_getDictID_fromFrame(src, len);
        size_t n;

        if (id == 0)
                n = ZSTD_decompressDCtx(dctx, dst, cap, src, len);
        else {
                const ZSTD_DDict *ddict;
                int r;

                r = ddict_get(s, id, &ddict);
                if (r < 0)
                        return r;
                /* A DDict is only read: threads share it. */
                n = ZSTD_decompress_usingDDict(dctx, dst, cap, src, len, ddict);
        }
        if (ZSTD_isError(n))
                return -EIO;
        *ret = n;
        return 0;
}
