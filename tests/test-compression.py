#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A tree of source code (/usr/include) copied into a subvolume reads back
identical, and usage shows it stored in less space than its logical size,
with the logical size exactly what the files hold.

  COWBOX_COMPRESSION_MAX_MB=N   copy at most this much of /usr/include (default 48)
"""

import os
import stat
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import MiB  # noqa: E402

SOURCE = '/usr/include'


def tree_size(path):
    """Bytes of the regular files at or under path (symlinks not followed)."""
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        return 0
    return sum(st.st_size for _, st in t.walk(path) if stat.S_ISREG(st.st_mode))


def choose(limit):
    """The entries of /usr/include to copy: all of them if they fit, else
    as many as fit, in name order."""
    chosen, total = [], 0
    for name in sorted(os.listdir(SOURCE)):
        size = tree_size(os.path.join(SOURCE, name))
        if total + size <= limit:
            chosen.append(name)
            total += size
    return chosen, total


def sizes(root):
    """Bytes of regular files, and of symlink targets and directories (which
    a store may or may not count as logical bytes)."""
    files = extra = 0
    for _, st in t.walk(root):
        if stat.S_ISREG(st.st_mode):
            files += st.st_size
        else:
            extra += st.st_size
    return files, extra


def distinct_inodes(root):
    return len({st.st_ino for _, st in t.walk(root)})


def run():
    t.require_fuse()
    if not os.path.isdir(SOURCE):
        t.skip(f'{SOURCE} is missing')
    limit = t.env_int('COWBOX_COMPRESSION_MAX_MB', 48) * MiB
    chosen, total = choose(limit)
    if total < MiB:
        t.skip(f'{SOURCE} holds less than 1 MiB of files')
    print(f'copying {len(chosen)} of {len(os.listdir(SOURCE))} entries of {SOURCE}, {total} bytes', flush=True)
    sub = t.Subtests()
    with t.Store('compression') as store:
        store.create('include')
        with store.mount('include') as m:
            for name in chosen:
                t.copy_tree(os.path.join(SOURCE, name), m.p(name))
            sub.run('the copy reads back identical', t.assert_trees_equal, SOURCE, m.path, top=chosen,
                    what=f'{SOURCE} and its copy in the mount differ')
            files, extra = sizes(m.path)
            t.check_equal(files, total, 'bytes of regular files in the mount')
            inodes = distinct_inodes(m.path)
        with store.mount('include', readonly=True) as m:
            sub.run('the copy reads back identical after a remount', t.assert_trees_equal, SOURCE, m.path,
                    top=chosen, what=f'{SOURCE} and its copy differ after a remount')
        sub.run('space accounting', check_accounting, store, files, extra, inodes)
    sub.check()


def check_accounting(store, files, extra, inodes):
    usage = store.usage()
    info = store.show('include')
    entry = t.json_usage_subvolume(usage, 'include')
    logical, referenced = info['logical_bytes'], info['referenced_bytes']
    disk = t.disk_usage(store.path)
    print(f'subvolume: logical {logical}, referenced {referenced}, exclusive {info["exclusive_bytes"]}, '
          f'inodes {info["inodes"]}')
    print(f'store: logical {usage["logical_bytes"]}, stored {usage["stored_bytes"]} '
          f'(data {usage["data_bytes"]}, metadata {usage["metadata_bytes"]}), '
          f'pack files {usage["pack_file_bytes"]}, on disk {disk}')
    if referenced:
        print(f'compression ratio {logical / referenced:.2f} (logical / referenced)')
    if disk:
        print(f'on disk ratio {logical / disk:.2f} (logical / bytes the store directory takes)')
    t.check(files <= logical <= files + extra,
            f'logical bytes {logical}: the files hold {files} (+{extra} in symlinks and directories)')
    t.check_equal(entry.get('logical_bytes'), logical, 'logical bytes in usage and in subvolume show')
    t.check(0 < referenced < logical, f'referenced bytes {referenced} are not less than logical {logical}')
    t.check(usage['stored_bytes'] < usage['logical_bytes'],
            f'the store keeps {usage["stored_bytes"]} bytes for {usage["logical_bytes"]} logical')
    t.check(0 < usage['data_bytes'] <= usage['stored_bytes'],
            f'data bytes {usage["data_bytes"]}, stored {usage["stored_bytes"]}')
    t.check(usage['pack_file_bytes'] >= usage['data_bytes'],
            f'pack files hold {usage["pack_file_bytes"]} bytes, less than the data {usage["data_bytes"]}')
    t.check(disk < logical, f'the store takes {disk} bytes on disk for {logical} logical')
    t.check(inodes <= info['inodes'] <= inodes + 16,
            f'subvolume show counts {info["inodes"]} inodes; the mount shows {inodes} (and a root)')


t.main(run)
