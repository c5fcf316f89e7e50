/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A small hash map from 16-byte keys (block digests, or inode numbers in
 * the first 8 bytes) to a path and two numbers, for send.c. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct KeyMapEntry {
        uint8_t key[16];
        char *path;             /* NULL: the slot is free */
        uint64_t offset;
        uint64_t size;
} KeyMapEntry;

typedef struct KeyMap {
        KeyMapEntry *slots;
        size_t n_slots;         /* a power of two, or 0 */
        size_t n;
} KeyMap;

void keymap_done(KeyMap *m);
KeyMapEntry *keymap_get(const KeyMap *m, const uint8_t key[16]);
/* Adds the entry unless the key is there already (then 0); 1 if added. */
int keymap_add(KeyMap *m, const uint8_t key[16], const char *path, uint64_t offset, uint64_t size);
/* Adds the entry, or changes the one the key has. */
int keymap_set(KeyMap *m, const uint8_t key[16], const char *path, uint64_t offset, uint64_t size);

static inline void keymap_ino_key(uint64_t ino, uint8_t ret[16]) {
        for (unsigned i = 0; i < 16; i++)
                ret[i] = i < 8 ? (uint8_t) (ino >> (8 * i)) : 0;
}
