/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "keymap.h"
#include "xxhash-util.h"

void keymap_done(KeyMap *m) {
        for (size_t i = 0; i < m->n_slots; i++)
                free(m->slots[i].path);
        free(m->slots);
        *m = (KeyMap) {};
}

static size_t slot_of(const KeyMap *m, const uint8_t key[16]) {
        return (size_t) XXH3_64bits(key, 16) & (m->n_slots - 1);
}

KeyMapEntry *keymap_get(const KeyMap *m, const uint8_t key[16]) {
        if (m->n_slots == 0)
                return NULL;
        for (size_t i = slot_of(m, key);; i = (i + 1) & (m->n_slots - 1)) {
                KeyMapEntry *e = &m->slots[i];

                if (!e->path)
                        return NULL;
                if (memcmp(e->key, key, 16) == 0)
                        return e;
        }
}

static int keymap_grow(KeyMap *m) {
        KeyMap bigger = { .n_slots = m->n_slots ? m->n_slots * 2 : 256 };

        bigger.slots = calloc(bigger.n_slots, sizeof *bigger.slots);
        if (!bigger.slots)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_slots; i++) {
                KeyMapEntry *e = &m->slots[i];
                size_t j;

                if (!e->path)
                        continue;
                for (j = slot_of(&bigger, e->key); bigger.slots[j].path; j = (j + 1) & (bigger.n_slots - 1))
                        ;
                bigger.slots[j] = *e;
                bigger.n++;
        }
        free(m->slots);
        *m = bigger;
        return 0;
}

int keymap_add(KeyMap *m, const uint8_t key[16], const char *path, uint64_t offset, uint64_t size) {
        size_t i;
        int r;

        if (keymap_get(m, key))
                return 0;
        if ((m->n + 1) * 4 > m->n_slots * 3) {
                r = keymap_grow(m);
                if (r < 0)
                        return r;
        }
        for (i = slot_of(m, key); m->slots[i].path; i = (i + 1) & (m->n_slots - 1))
                ;
        m->slots[i].path = strdup(path);
        if (!m->slots[i].path)
                return -ENOMEM;
        memcpy(m->slots[i].key, key, 16);
        m->slots[i].offset = offset;
        m->slots[i].size = size;
        m->n++;
        return 1;
}

int keymap_set(KeyMap *m, const uint8_t key[16], const char *path, uint64_t offset, uint64_t size) {
        KeyMapEntry *e = keymap_get(m, key);
        char *copy;

        if (!e)
                return keymap_add(m, key, path, offset, size);
        copy = strdup(path);
        if (!copy)
                return -ENOMEM;
        free(e->path);
        e->path = copy;
        e->offset = offset;
        e->size = size;
        return 0;
}
