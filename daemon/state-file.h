/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The daemon's lists kept beside the store (workspaces, sandboxes): JSON
 * files replaced whole and synced, and read back strictly.
 */

#include <jansson.h>

/* Reads the list at path into *ret (NULL when there is no file yet). A
 * file that cannot be read or parsed is an error (-EUCLEAN when damaged),
 * with a sentence in *ret_error naming the file (what says what it lists)
 * and the damage: replaced by an empty list, it would forget them all. */
int state_file_load(const char *path, const char *what, size_t flags, json_t **ret, char **ret_error);

/* Writes doc to a temporary file, syncs it and renames it over path, then
 * syncs the directory: after a crash the list is the old or the new one. */
int state_file_save(const char *path, json_t *doc);
