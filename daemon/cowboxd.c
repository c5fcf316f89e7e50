/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * cowboxd: owns a cowbox store and serves it on the system bus as
 * org.cowbox1 (or on the bus DBUS_SYSTEM_BUS_ADDRESS names).
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api.h"
#include "cleanup.h"
#include "manager.h"
#include "runtime.h"

/* The store's own words for its errors (a directory that holds no store,
 * a format too new, damage), else the errno's. */
static const char *store_error_text(int r) {
        const char *text = store_strerror(r);

        return text ? text : strerror(-r);
}

static void help(void) {
        printf("Usage: cowboxd [--store DIR] [--init] [--reap-low-mark PERCENT]\n"
               "               [--reap-high-mark PERCENT]\n"
               "\n"
               "Owns a cowbox store and serves it on the system bus as " API_SERVICE ", or on the\n"
               "bus that $DBUS_SYSTEM_BUS_ADDRESS names. Runs until SIGTERM or SIGINT.\n"
               "\n"
               "Options:\n"
               "  --store DIR                the store (default: $COWBOX_STORE, else\n"
               "                             " STORE_DEFAULT_PATH ")\n"
               "  --init                     create the store if DIR holds none\n"
               "  --reap-low-mark PERCENT    below this much free disk, the reaper works at\n"
               "                             full speed (default 10)\n"
               "  --reap-high-mark PERCENT   ... until this much is free again (default 20,\n"
               "                             or the low mark if that is higher)\n"
               "  --help                     show this help\n"
               "  --version                  show the version\n"
               "\n"
               "At start it removes what receives that died left behind and lets the reaper\n"
               "finish deletions. Control it with the cowbox command or any D-Bus client.\n"
               "\n"
               "Exit status: 0 after SIGTERM or SIGINT; 1 when the store cannot be opened or\n"
               "the bus name cannot be had; 2 on bad usage.\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "store",   required_argument, NULL, 's' },
                { "init",    no_argument,       NULL, 'i' },
                { "reap-low-mark", required_argument, NULL, 'l' },
                { "reap-high-mark", required_argument, NULL, 'H' },
                { "help",    no_argument,       NULL, 'h' },
                { "version", no_argument,       NULL, 'v' },
                {}
        };
        const char *store = getenv("COWBOX_STORE");
        _cleanup_free_ char *error = NULL, *cgroup_base = NULL;
        Manager *m = NULL;
        bool init = false, high_given = false;
        long low = 10, high = 20;
        int c, r;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 's':
                        store = optarg;
                        break;
                case 'i':
                        init = true;
                        break;
                case 'l':
                case 'H': {
                        char *end = NULL;
                        long v = strtol(optarg, &end, 10);

                        if (!end || end == optarg || *end || v < 0 || v > 100) {
                                fprintf(stderr, "cowboxd: --reap-low-mark and --reap-high-mark take a percent of "
                                        "the disk, 0 to 100\n");
                                return 2;
                        }
                        if (c == 'l')
                                low = v;
                        else {
                                high = v;
                                high_given = true;
                        }
                        break;
                }
                case 'h':
                        help();
                        return EXIT_SUCCESS;
                case 'v':
                        printf("cowboxd " COWBOX_VERSION "\n");
                        return EXIT_SUCCESS;
                default:
                        fprintf(stderr, "cowboxd: see 'cowboxd --help'\n");
                        return 2;
                }
        if (optind < argc) {
                fprintf(stderr, "cowboxd: unexpected argument '%s'; see 'cowboxd --help'\n", argv[optind]);
                return 2;
        }
        /* The high mark given alone, or with the low one, must be above it;
         * the low mark given alone lifts the default high mark to it. */
        if (high_given && high < low) {
                fprintf(stderr, "cowboxd: --reap-high-mark (%ld%%) is below --reap-low-mark (%ld%%); see "
                        "'cowboxd --help'\n", high, low);
                return 2;
        }
        if (!store || !*store)
                store = STORE_DEFAULT_PATH;

        if (init) {
                r = store_init(store);
                if (r < 0 && r != -EEXIST) {
                        fprintf(stderr, "cowboxd: cannot create a store at %s: %s\n", store, store_error_text(r));
                        return EXIT_FAILURE;
                }
        }
        /* First, while it is the only process: a service with
         * Delegate=yes moves into a leaf of its cgroup, so that the
         * sandboxes' cgroups below it can have controllers. */
        r = runtime_cgroup_delegate(&cgroup_base);
        if (r < 0)
                fprintf(stderr, "cowboxd: cannot move into a leaf of the cgroup delegated to it: %s; cgroup v2 "
                        "limits will not apply\n", strerror(-r));
        r = manager_new(store, &m);
        if (r < 0) {
                fprintf(stderr, "cowboxd: cannot open the store at %s: %s%s\n", store, store_error_text(r),
                        r == -ENOENT ? " (create it with --init)" : "");
                return EXIT_FAILURE;
        }
        m->cgroup_base = TAKE_PTR(cgroup_base);
        m->low_mark = (unsigned) low;
        m->high_mark = (unsigned) (high > low ? high : low);
        r = manager_start(m, &error);
        if (r < 0) {
                if (error)
                        fprintf(stderr, "cowboxd: %s\n", error);
                else
                        fprintf(stderr, "cowboxd: cannot serve on the bus: %s%s\n", strerror(-r),
                                r == -EEXIST ? " (another cowboxd has the name " API_SERVICE ")" :
                                r == -EACCES || r == -EPERM ? " (the bus's policy does not let it own " API_SERVICE
                                ": install contrib/org.cowbox1.conf into /etc/dbus-1/system.d and reload the bus)" :
                                r == -ENOENT || r == -ECONNREFUSED ? " (no system bus; set "
                                "DBUS_SYSTEM_BUS_ADDRESS)" : "");
                manager_free(m);
                return EXIT_FAILURE;
        }
        fprintf(stderr, "cowboxd: serving the store at %s as " API_SERVICE "\n", m->store_path);
        r = manager_run(m);
        manager_free(m);
        if (r < 0) {
                fprintf(stderr, "cowboxd: %s\n", strerror(-r));
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}
