#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The reaper folds a layer that has a single child into that child. A fold
changes nothing a user can see: every live subvolume keeps its files, their
contents and inode numbers, and its figures (logical bytes, inodes), and
the files made after it take inode numbers nobody has; fsck finds a subvolume whose next inode
number is taken, and repairs it. Among the folds:
layers that were never written (a snapshot freezes the origin's top even
when it is still empty), above a layer that a live snapshot shares. (A
fold of two such layers made a database with the counters of an empty
subvolume: the origin showed 0 inodes, and its next new file took inode 2
and with it the content of the file that had it.)"""

import hashlib
import os
import sqlite3
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402


def tree(mount):
    """{path: (inode, mode, digest of the content)} of a mounted subvolume."""
    seen = {}
    for root, dirs, files in os.walk(mount.p('')):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            digest = None
            if os.path.isfile(path) and not os.path.islink(path):
                digest = hashlib.sha256(t.read_file(path)).hexdigest()
            seen[os.path.relpath(path, mount.p(''))] = (st.st_ino, st.st_mode, digest)
    return seen


def state(store):
    """What users see of every live subvolume."""
    seen = {}
    for info in store.list():
        with store.mount(info['name'], readonly=True) as m:
            seen[info['name']] = (info['logical_bytes'], info['inodes'], tree(m))
    return seen


def write_files(store, name, prefix, count, seed):
    with store.mount(name) as m:
        for i in range(count):
            t.write_file(m.p(f'{prefix}{i}'), t.random_bytes(100 + 37 * i, seed + i), fsync=True)


def reap_and_compare(store, what):
    before = state(store)
    folded = 0
    for _ in range(3):      # dropping layers makes folds possible for the next reap
        folded += store.json('reap', '--wait')['layers_folded']
    t.check(folded > 0, f'{what}: the reaper folded no layer, so nothing was tested')
    after = state(store)
    for name in before:
        logical, inodes, files = after[name]
        t.check_equal((logical, inodes), before[name][:2], f'{what}: logical bytes and inodes of {name} after folds')
        t.check_equal(files, before[name][2], f'{what}: files of {name} after folds')
    store.fsck()
    return after


def check_new_inodes(store, name, seen, what):
    """Files made after the folds take inode numbers no file of the
    subvolume has (each subvolume numbers its own)."""
    used = {ino for ino, _, _ in seen[name][2].values()}
    with store.mount(name) as m:
        for i in range(3):
            t.write_file(m.p(f'new{i}'), b'made after the folds %d\n' % i, fsync=True)
        for i in range(3):
            ino = os.lstat(m.p(f'new{i}')).st_ino
            t.check(ino not in used, f'{what}: new file new{i} of {name} took inode {ino}, which a file has')
    seen_now = state(store)
    for sub, (_, _, files) in seen.items():
        for path, entry in files.items():
            t.check_equal(seen_now[sub][2].get(path), entry, f'{what}: {sub}/{path} after new files in {name}')
    store.fsck()


def test_unwritten_above_shared():
    with t.Store('fold-unwritten') as store:
        store.create('x')
        write_files(store, 'x', 'f', 5, 1)
        store.snapshot('x', 'keep')          # shares x's written layer for good
        for i in range(3):                   # each freezes x's top, never written
            store.snapshot('x', f'gone{i}')
        for i in range(3):
            store.delete(f'gone{i}', reap=False)
        seen = reap_and_compare(store, 'unwritten layers above a shared one')
        check_new_inodes(store, 'x', seen, 'unwritten layers above a shared one')


def test_written_between():
    with t.Store('fold-written') as store:
        store.create('x')
        write_files(store, 'x', 'a', 4, 10)
        store.snapshot('x', 'keep', readonly=True)
        for round in range(4):
            store.snapshot('x', f's{round}')
            if round % 2 == 0:
                write_files(store, 'x', f'r{round}-', 2, 20 + round)     # x's new top is written
            if round == 1:
                write_files(store, f's{round}', 'own', 2, 40)           # and one snapshot's
        for round in (0, 2, 3):
            store.delete(f's{round}', reap=False)
        seen = reap_and_compare(store, 'written and unwritten layers')
        check_new_inodes(store, 'x', seen, 'written and unwritten layers')
        check_new_inodes(store, 's1', state(store), 'written and unwritten layers')


def test_fsck_next_ino():
    """A store where the bug struck: the counters of an empty subvolume on
    top of one with files (copied with their valid record checks)."""
    with t.Store('fold-fsck') as store:
        store.create('x')
        write_files(store, 'x', 'f', 5, 60)
        store.create('empty')
        layers = os.path.join(store.path, 'layers')
        db = sqlite3.connect(os.path.join(layers, f"{store.show('x')['top_layer']}.db"))
        db.execute('ATTACH ? AS empty', (os.path.join(layers, f"{store.show('empty')['top_layer']}.db"),))
        db.execute('DELETE FROM main.info')
        db.execute('INSERT INTO main.info SELECT * FROM empty.info')
        db.commit()
        db.close()

        r = store.run('fsck', expect=1)
        t.check("subvolume 'x': the next inode number, 2, is taken" in r.out, f'fsck of the damage:\n{r.describe()}')
        r = store.run('fsck', '--repair')
        t.check('(repaired)' in r.out, f'fsck --repair:\n{r.describe()}')
        store.fsck()
        check_new_inodes(store, 'x', state(store), 'after the repair')


def run():
    t.require_fuse()
    sub = t.Subtests()
    sub.run('never-written layers above a shared one', test_unwritten_above_shared)
    sub.run('written layers between snapshots', test_written_between)
    sub.run('fsck repairs a next inode number that is taken', test_fsck_next_ino)
    sub.check()


t.main(run)
