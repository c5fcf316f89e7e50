#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""'subvolume delete' starts a reaper in the background, from a process that
has the store open and exits at once. The reaper's work must survive that
exit: deleting a snapshot folds the origin's layers, and the origin keeps
every file, also when another reap follows at once. (A reaper that reused
the state of its parent's database connection lost its commits when the
parent closed: the origin came back empty.) A mount while the reaper folds
the origin's layers sees all of it too."""

import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

ROUNDS = 4


def run():
    t.require_fuse()
    files = {f'f{i}': t.random_bytes(100 * KiB + i, i) for i in range(6)}
    files['small'] = b'small file\n'
    with t.Store('reaper-background') as store:
        store.create('main')
        with store.mount('main') as m:
            for name, content in files.items():
                t.write_file(m.p(name), content, fsync=True)
        for round in range(ROUNDS):
            store.snapshot('main', 'copy', readonly=True)
            store.run('subvolume', 'delete', 'copy')    # a background reaper
            if round % 2 == 0:
                store.reap()    # and one more at once
            # else: main is mounted while the background reaper folds it
            with store.mount('main', readonly=True) as m:
                t.check_equal(sorted(os.listdir(m.p(''))), sorted(files), f'round {round}: files of main')
                for name, content in files.items():
                    t.check_bytes(t.read_file(m.p(name)), content, f'round {round}: {name}')
            store.fsck()
        store.run('scrub')


t.main(run)
