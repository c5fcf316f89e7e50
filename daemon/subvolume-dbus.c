/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Subvolume objects: /org/cowbox1/subvolume/NAME (escaped), with their
 * state as properties and the methods that act on one. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cleanup.h"
#include "images.h"
#include "manager.h"
#include "string-util.h"

/* The object's userdata is the manager; its name comes from the path. */
int subvolume_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                          void **found, sd_bus_error *error) {
        _cleanup_free_ char *name = NULL;
        const StoreSubvolumeInfo *info;
        Manager *m = userdata;
        int r;

        r = api_subvolume_name_from_path(path, &name);
        if (r <= 0 || !store_name_is_valid(name) || startswith(name, IMAGE_RECEIVING_PREFIX))
                return 0;       /* one being received is no object yet */
        r = manager_subvolume_info(m, name, &info);
        if (r < 0)
                return 0;
        *found = m;
        return 1;
}

/* Names only: the space figures of every subvolume would open every
 * layer of the store for a listing of paths. */
int subvolume_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        _cleanup_strv_free_ char **names = NULL;
        Manager *m = userdata;
        size_t n = 0, k = 0;
        char **list;
        int r;

        r = store_subvolume_names(m->store, &names);
        if (r < 0)
                return r;
        while (names[n])
                n++;
        list = calloc(n + 1, sizeof *list);
        for (size_t i = 0; list && i < n; i++)
                if (!startswith(names[i], IMAGE_RECEIVING_PREFIX) && api_subvolume_path(names[i], &list[k]) >= 0)
                        k++;
        if (!list)
                return -ENOMEM;
        *nodes = list;
        return 0;
}

static int subvolume_info(sd_bus_message *message, void *userdata, StoreSubvolumeInfo *ret,
                          sd_bus_error *error) {
        _cleanup_free_ char *name = NULL;
        Manager *m = userdata;
        int r;

        r = api_subvolume_name_from_path(sd_bus_message_get_path(message), &name);
        if (r <= 0)
                return -ENOENT;
        r = store_subvolume_show(m->store, name, ret);
        return r < 0 ? store_error_reply(r, name, error) : 0;
}

static int property_get(sd_bus *bus, const char *path, const char *interface, const char *property,
                        sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *name = NULL, *json = NULL;
        const StoreSubvolumeInfo *info;
        Manager *m = userdata;
        int r;

        r = api_subvolume_name_from_path(path, &name);
        if (r <= 0)
                return -ENOENT;
        r = manager_subvolume_info(m, name, &info);
        if (r < 0)
                return store_error_reply(r, name, error);
        if (strcmp(property, "Name") == 0) {
                /* D-Bus strings are UTF-8; names may hold other bytes. */
                json_t *name_json = api_json_string_lossy(info->name);

                r = name_json ? sd_bus_message_append(reply, "s", json_string_value(name_json)) : -ENOMEM;
                json_decref(name_json);
        } else if (strcmp(property, "UUID") == 0)
                r = sd_bus_message_append(reply, "s", info->uuid);
        else if (strcmp(property, "ReadOnly") == 0)
                r = sd_bus_message_append(reply, "b", info->readonly);
        else if (strcmp(property, "LogicalBytes") == 0)
                r = sd_bus_message_append(reply, "t", info->logical_bytes);
        else if (strcmp(property, "ExclusiveBytes") == 0)
                r = sd_bus_message_append(reply, "t", info->exclusive_bytes);
        else if (strcmp(property, "QuotaBytes") == 0)
                r = sd_bus_message_append(reply, "t", info->quota_bytes);
        else {
                json_t *doc = api_subvolume_to_json(info);

                json = api_json_text(doc);
                json_decref(doc);
                r = json ? sd_bus_message_append(reply, "s", json) : -ENOMEM;
        }
        return r;
}

static int method_delete(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        StoreSubvolumeInfo info = {};
        int r;

        r = subvolume_info(message, userdata, &info, error);
        if (r < 0)
                return r;
        r = manager_delete(message, userdata, info.name, false, error);
        store_subvolume_info_clear(&info);
        return r;
}

static int method_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        StoreSubvolumeInfo info = {};
        const char *name, *options;
        int r;

        r = sd_bus_message_read(message, "ss", &name, &options);
        if (r < 0)
                return r;
        r = subvolume_info(message, userdata, &info, error);
        if (r < 0)
                return r;
        r = manager_snapshot(message, userdata, info.name, name, options, error);
        store_subvolume_info_clear(&info);
        return r;
}

const sd_bus_vtable subvolume_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Name", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("UUID", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("ReadOnly", "b", property_get, 0, 0),
        SD_BUS_PROPERTY("LogicalBytes", "t", property_get, 0, 0),
        SD_BUS_PROPERTY("ExclusiveBytes", "t", property_get, 0, 0),
        SD_BUS_PROPERTY("QuotaBytes", "t", property_get, 0, 0),
        SD_BUS_PROPERTY("Json", "s", property_get, 0, 0),
        SD_BUS_METHOD_WITH_ARGS("Delete", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, method_delete,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Snapshot", SD_BUS_ARGS("s", name, "s", options_json), SD_BUS_RESULT("o", path),
                                method_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END
};
