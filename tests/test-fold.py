#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The reaper folds a layer that has a single child into that child. A fold
changes nothing a user can see: every live subvolume keeps its files, their
contents and inode numbers, and its figures (logical bytes, inodes), and
the files made after it take inode numbers nobody has; fsck finds a subvolume whose next inode
number is taken or whose counts of inodes and bytes disagree with its
layers, and repairs them, and a mount before the repair hands out no
number that is taken. A snapshot of a top never written stacks no layer
on its source (such layers once came about, and a fold of two of them
made a database with the counters of an empty subvolume: the origin
showed 0 inodes, and its next new file took inode 2 and with it the
content of the file that had it). usage counts nothing of
the layer a fold is building as reclaimable, and of one a killed fold left,
its file alone; a fold's writes count against the reaper's rate. A
snapshot taken after the reaper chose the layer below its source's top
to fold keeps that layer. Last,
seeded random sequences of writes, snapshots, deletes and reaps, checked
against a model after every reap.

  COWBOX_FOLD_SEED=N        replay one seed (printed by every run)
  COWBOX_FOLD_SEEDS=N       how many seeds (default 2)
  COWBOX_FOLD_STEPS=N       operations per seed (default 60)
"""

import contextlib
import fcntl
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import time

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


def reap_and_compare(store, what, folds=True):
    before = state(store)
    folded = 0
    for _ in range(3):      # dropping layers makes folds possible for the next reap
        folded += store.json('reap', '--wait')['layers_folded']
    if folds:
        t.check(folded > 0, f'{what}: the reaper folded no layer, so nothing was tested')
    after = state(store)
    for name in before:
        logical, inodes, files = after[name]
        t.check_equal((logical, inodes), before[name][:2], f'{what}: logical bytes and inodes of {name} after folds')
        t.check_equal(files, before[name][2], f'{what}: files of {name} after folds')
    store.fsck()
    return after


def check_new_inodes(store, name, seen, what, fsck=True):
    """Files made after the folds take inode numbers no file of the
    subvolume has (each subvolume numbers its own)."""
    used = {ino for ino, _, _ in seen[name][2].values()}
    new = [f'new{len(used)}-{i}' for i in range(3)]
    with store.mount(name) as m:
        for fname in new:
            t.write_file(m.p(fname), f'made after the folds: {fname}\n'.encode(), fsync=True)
        for fname in new:
            ino = os.lstat(m.p(fname)).st_ino
            t.check(ino not in used, f'{what}: new file {fname} of {name} took inode {ino}, which a file has')
    seen_now = state(store)
    for sub, (_, _, files) in seen.items():
        for path, entry in files.items():
            t.check_equal(seen_now[sub][2].get(path), entry, f'{what}: {sub}/{path} after new files in {name}')
    if fsck:
        store.fsck()


def test_unwritten_above_shared():
    """Snapshots of a top never written since the last one stack no layer
    on the source, nor on themselves: each is a new top on the layer
    below, and every one of them is still its own."""
    with t.Store('fold-unwritten') as store:
        store.create('x')
        write_files(store, 'x', 'f', 5, 1)
        store.snapshot('x', 'keep')          # shares x's written layer for good
        depth = store.show('x')['depth']
        for i in range(3):
            store.snapshot('x', f'gone{i}')
        shown = {n: store.show(n) for n in ('x', 'keep', 'gone0', 'gone1', 'gone2')}
        t.check_equal({n: i['depth'] for n, i in shown.items()}, dict.fromkeys(shown, depth),
                      'depths after snapshots of an unwritten top')
        t.check_equal(len({i['top_layer'] for i in shown.values()}), len(shown), 'distinct tops')
        write_files(store, 'gone1', 'own', 2, 30)
        write_files(store, 'x', 'later', 2, 31)
        files = state(store)
        t.check('own0' in files['gone1'][2] and 'own0' not in files['x'][2] and 'own0' not in files['gone0'][2],
                'a file written in one snapshot is in no other')
        t.check('later0' in files['x'][2] and 'later0' not in files['gone2'][2], 'x\'s later file is its own')
        for i in range(3):
            store.delete(f'gone{i}', reap=False)
        seen = reap_and_compare(store, 'unwritten layers above a shared one', folds=False)
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


def test_one_reap_folds():
    """A live subvolume snapshotted per patch, each snapshot thrown away: one
    reap takes the stack back to a single layer, with every file as it was."""
    with t.Store('fold-one-reap') as store:
        store.create('x')
        write_files(store, 'x', 'f', 4, 10)
        for i in range(6):
            store.snapshot('x', f'patch{i}')
            write_files(store, 'x', f'p{i}-', 2, 20 + i)
        t.check_equal(store.show('x')['depth'], 7, 'the stack of x before the deletes')
        for i in range(6):
            store.delete(f'patch{i}', reap=False)
        before = state(store)
        t.check(store.json('reap', '--wait')['layers_folded'] >= 6, 'the reap folded the stack')
        t.check_equal(store.show('x')['depth'], 1, 'the stack of x after one reap')
        t.check_equal(state(store), before, 'x after the fold')
        store.fsck()


def give_empty_counters(store, name):
    """What the bug did: the counters of an empty subvolume on top of one
    with files (copied with their valid record checks)."""
    layers = os.path.join(store.path, 'layers')
    db = sqlite3.connect(os.path.join(layers, f"{store.show(name)['top_layer']}.db"))
    db.execute('ATTACH ? AS empty', (os.path.join(layers, f"{store.show('empty')['top_layer']}.db"),))
    db.execute('DELETE FROM main.info')
    db.execute('INSERT INTO main.info SELECT * FROM empty.info')
    db.commit()
    db.close()


def test_fsck_next_ino():
    """A store where the bug struck: fsck reports and repairs it, and a
    mount of it before the repair hands out no number that is taken."""
    with t.Store('fold-fsck') as store:
        store.create('x')
        write_files(store, 'x', 'f', 5, 60)
        store.create('empty')

        give_empty_counters(store, 'x')
        r = store.run('fsck', expect=1)
        t.check("subvolume 'x': the next inode number, 2, is taken" in r.out, f'fsck of the damage:\n{r.describe()}')
        r = store.run('fsck', '--repair')
        t.check('(repaired)' in r.out, f'fsck --repair:\n{r.describe()}')
        store.fsck()
        check_new_inodes(store, 'x', state(store), 'after the repair')

        # Mounted before a repair: no number taken; the counts of inodes
        # and bytes, which started from an empty subvolume's, are repaired
        # by fsck from what the layers hold.
        give_empty_counters(store, 'x')
        check_new_inodes(store, 'x', state(store), 'mounted before a repair', fsck=False)
        r = store.run('fsck', expect=1)
        t.check("subvolume 'x': its counters say" in r.out, f'fsck of the counters:\n{r.describe()}')
        store.run('fsck', '--repair')
        store.fsck()
        info = store.show('x')
        with store.mount('x', readonly=True) as m:
            names = os.listdir(m.p(''))
            size = sum(os.lstat(m.p(n)).st_size for n in names)
        t.check_equal((info['inodes'], info['logical_bytes']), (len(names) + 1, size),
                      'inodes and logical bytes of x after the repair')


MAX_SUBVOLUMES = 6


class Model:
    """What each live subvolume must hold: flat files, name -> content."""

    def __init__(self, rng):
        self.rng = rng
        self.subvolumes = {}        # name -> (readonly, {file: content})
        self.made = 0
        self.log = []

    def new_name(self):
        self.made += 1
        return f'v{self.made}'


def random_write(store, model, name):
    readonly, files = model.subvolumes[name]
    rng = model.rng
    changes = []
    with store.mount(name) as m:
        for _ in range(rng.randrange(1, 4)):
            kind = rng.choice(['new', 'new', 'overwrite', 'remove']) if files else 'new'
            if kind == 'new':
                fname = f'f{model.made}-{rng.randrange(1 << 30)}'
                files[fname] = t.random_bytes(rng.choice([10, 300, 5000, 70000]), rng.randrange(1 << 30))
                t.write_file(m.p(fname), files[fname])
            elif kind == 'overwrite':
                fname = rng.choice(sorted(files))
                files[fname] = t.random_bytes(rng.choice([0, 20, 4096, 100000]), rng.randrange(1 << 30))
                t.write_file(m.p(fname), files[fname])
            else:
                fname = rng.choice(sorted(files))
                os.unlink(m.p(fname))
                del files[fname]
            changes.append(f'{kind} {fname}')
        t.fsync_dir(m.p(''))
    return ', '.join(changes)


def verify(store, model, what):
    listed = {s['name']: s for s in store.list()}
    t.check_equal(sorted(listed), sorted(model.subvolumes), f'{what}: subvolumes')
    for name, (_, files) in model.subvolumes.items():
        info = listed[name]
        t.check_equal((info['inodes'], info['logical_bytes']),
                      (len(files) + 1, sum(len(c) for c in files.values())),
                      f'{what}: inodes and logical bytes of {name}')
        with store.mount(name, readonly=True) as m:
            t.check_equal(sorted(os.listdir(m.p(''))), sorted(files), f'{what}: files of {name}')
            inodes = {}
            for fname, content in files.items():
                t.check_bytes(t.read_file(m.p(fname)), content, f'{what}: {name}/{fname}')
                ino = os.lstat(m.p(fname)).st_ino
                t.check(ino not in inodes, f'{what}: {name}/{fname} and {inodes.get(ino)} share inode {ino}')
                inodes[ino] = fname


def random_sequence(seed, steps):
    print(f'seed {seed}: {steps} operations (replay: COWBOX_FOLD_SEED={seed} COWBOX_FOLD_STEPS={steps})',
          flush=True)
    rng = random.Random(seed)
    model = Model(rng)
    folded = 0
    with t.Store(f'fold-random-{seed}') as store:
        first = model.new_name()
        store.create(first)
        model.subvolumes[first] = (False, {})
        for step in range(steps):
            writable = sorted(n for n, (ro, _) in model.subvolumes.items() if not ro)
            # Snapshots and deletes often, writes less: chains of layers
            # never written, above shared ones, are what folds get wrong.
            choices = ['write'] * 2 + ['snapshot'] * 3 + ['delete'] * 2 + ['reap']
            op = rng.choice(choices)
            if op == 'snapshot' and len(model.subvolumes) >= MAX_SUBVOLUMES:
                op = 'delete'
            if op == 'delete' and len(model.subvolumes) <= 1:
                op = 'snapshot'
            if op == 'write' and not writable:
                op = 'snapshot'
            try:
                if op == 'write':
                    name = rng.choice(writable)
                    model.log.append(f'#{step} write {name}: {random_write(store, model, name)}')
                elif op == 'snapshot':
                    source = rng.choice(sorted(model.subvolumes))
                    name, readonly = model.new_name(), rng.random() < 0.3
                    store.snapshot(source, name, readonly=readonly)
                    model.subvolumes[name] = (readonly, dict(model.subvolumes[source][1]))
                    model.log.append(f'#{step} snapshot {source} -> {name}{" read-only" if readonly else ""}')
                elif op == 'delete':
                    name = rng.choice(sorted(model.subvolumes))
                    store.delete(name, reap=False)
                    del model.subvolumes[name]
                    model.log.append(f'#{step} delete {name}')
                else:
                    folded += store.json('reap', '--wait')['layers_folded']
                    model.log.append(f'#{step} reap')
                    verify(store, model, f'seed {seed} after step #{step}')
            except BaseException:
                print('operations so far:\n  ' + '\n  '.join(model.log[-40:]), flush=True)
                raise
        store.json('reap', '--wait')
        verify(store, model, f'seed {seed} at the end')
        store.fsck()
    print(f'seed {seed}: {folded} layers folded along the way', flush=True)
    return folded


def test_random():
    steps = t.env_int('COWBOX_FOLD_STEPS', 60)
    seeds = t.seeds('COWBOX_FOLD_SEED', 'COWBOX_FOLD_SEEDS', 2)
    folded = sum(random_sequence(seed, steps) for seed in seeds)
    t.check(folded > 0, f'seeds {seeds} folded no layer: nothing was tested')


def layer_ids(store):
    return {int(name[:-3]) for name in os.listdir(os.path.join(store.path, 'layers')) if name.endswith('.db')}


def layer_file_bytes(store, layer):
    """What the store counts of a layer's files: the database and its WAL."""
    total = 0
    for suffix in ('', '-wal'):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(os.path.join(store.path, 'layers', f'{layer}.db{suffix}')).st_blocks * 512
    return total


def make_foldable(store, round):
    """A snapshot of x, deleted and reaped while x is served: x's frozen
    layer is left with a single child, x's written top, which the reap may
    not fold under its server; the next reap folds it."""
    store.snapshot('x', f'gone{round}')
    write_files(store, 'x', f'top{round}-', 3, 70 + round)
    store.delete(f'gone{round}', reap=False)
    with store.mount('x'):
        t.check_equal(store.json('reap', '--wait')['layers_folded'], 0, f'round {round}: folds under a server')
    t.check_equal(store.usage()['reclaimable_bytes'], 0, f'round {round}: reclaimable bytes before the fold')


def start_slow_reap(store):
    """A reaper at one byte a second: after a fold has built its merged
    layer it sleeps a second, the layer written but not yet swapped in."""
    store.run('reap', '--rate', '1')
    return subprocess.Popen([t.tool(), '--store', store.path, '--json', 'reap', '--wait'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def merged_layer(store, before):
    """The layer a fold is building: one more than the layers before it,
    all of which are still there."""
    ids = layer_ids(store)
    new = ids - before
    return next(iter(new)) if len(new) == 1 and before <= ids else None


def test_usage_during_fold():
    """usage counts what a reap would free: nothing of the layer a fold is
    building (it repeats rows of live layers and is about to be live
    itself), and of one left by a fold that was killed, its file alone.
    A fold's writes count against the reaper's rate."""
    with t.Store('fold-usage') as store:
        store.create('x')
        write_files(store, 'x', 'f', 40, 60)
        make_foldable(store, 0)
        seen = state(store)

        before = layer_ids(store)
        reaper = start_slow_reap(store)
        sampled = 0
        try:
            while reaper.poll() is None:
                merged = merged_layer(store, before)
                reclaimable = store.usage()['reclaimable_bytes']
                if merged is not None and merged_layer(store, before) == merged:
                    sampled += 1
                t.check_equal(reclaimable, 0, f'reclaimable bytes while the reaper folds (layer {merged})')
        finally:
            out, err = reaper.communicate(timeout=60)
        t.check_equal(reaper.returncode, 0, f'the slow reap: {err.decode(errors="replace")}')
        t.check(json.loads(out)['layers_folded'] >= 1, f'the slow reap folded no layer: {out!r}')
        t.check(sampled >= 3, f'usage ran {sampled} times while the merged layer was being built: '
                'the fold did not wait for the rate')
        t.check_equal(state(store), seen, 'subvolumes after the slow fold')

        make_foldable(store, 1)
        seen = state(store)
        before = layer_ids(store)
        reaper = start_slow_reap(store)
        try:
            merged = None
            deadline = time.monotonic() + 60
            while merged is None and reaper.poll() is None and time.monotonic() < deadline:
                merged = merged_layer(store, before)
                time.sleep(0.005)
            t.check(merged is not None, 'the slow reap ended without building a merged layer')
            reaper.kill()
        finally:
            reaper.communicate(timeout=60)
        store.fsck()
        t.check_equal(store.usage()['reclaimable_bytes'], layer_file_bytes(store, merged),
                      f'reclaimable bytes with the merged layer {merged} of a killed fold: its file alone')
        store.run('reap', '--rate', 'none')
        t.check(store.json('reap', '--wait')['layers_folded'] >= 1, 'the reap after the killed fold folded nothing')
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after the fold was done again')
        t.check(merged not in layer_ids(store), f'the layer {merged} of the killed fold is still there after a reap')
        t.check_equal(state(store), seen, 'subvolumes after the fold that was killed and done again')
        store.fsck()


def lock_path(store, name):
    return os.path.join(store.path, 'locks', f'subvolume-{store.show(name)["id"]}.lock')


def hold_lock(store, name):
    """Holds the lock of a subvolume; say_holder() tells the others who
    holds it and whether for a moment, as a fold or a snapshot does (they
    wait), or for long, as a server does (they are refused at once)."""
    f = open(lock_path(store, name), 'a+')
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def wait_for_waiter(pid, path, what):
    """Until process pid has the lock file open: it waits for the lock."""
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError):
            fds = os.listdir(f'/proc/{pid}/fd')
            if any(os.readlink(f'/proc/{pid}/fd/{fd}') == path for fd in fds):
                return
        t.check(time.monotonic() < deadline, f'{what} did not come to wait for the lock')
        time.sleep(0.01)


def say_holder(f, brief):
    f.seek(0)
    f.truncate()
    f.write(f'{os.getpid()}{" brief" if brief else ""}\n')
    f.flush()


def layer_rows(store):
    db = sqlite3.connect(f'file:{os.path.join(store.path, "catalog.db")}?mode=ro', uri=True)
    try:
        return {row[0] for row in db.execute('SELECT id FROM layers')}
    finally:
        db.close()


def test_snapshot_during_fold():
    """A snapshot of a top never written, taken after the reaper chose that
    top and the layer below as a pair to fold and before it took the
    top's lock, makes the layer below another subvolume's: a read-only
    snapshot's top, a writable one's parent. The fold, which would merge
    that layer away, sees this and leaves the pair; the snapshots keep
    their files. The reaper is held at the pair before it (whose lock is
    held as if for a moment) while the snapshots are taken."""
    with t.Store('fold-snapshot-race') as store:
        for name, seed in (('before', 80), ('x', 81)):
            store.create(name)
            write_files(store, name, 'f', 2, seed)
            store.snapshot(name, f'{name}-gone', readonly=True)
            store.delete(f'{name}-gone', reap=False)
        seen = state(store)
        rows = layer_rows(store)
        lock = hold_lock(store, 'before')
        try:
            say_holder(lock, brief=True)
            reaper = subprocess.Popen([t.tool(), '--store', store.path, '--json', 'reap', '--wait'],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            wait_for_waiter(reaper.pid, lock_path(store, 'before'), 'the reaper')
            store.snapshot('x', 'x-ro', readonly=True)
            store.snapshot('x', 'x-rw')
            say_holder(lock, brief=False)   # the reaper skips the first pair
            out, err = reaper.communicate(timeout=60)
        finally:
            lock.close()
        t.check_equal(reaper.returncode, 0, f'the reap: {err.decode(errors="replace")}')
        store.fsck()
        after = state(store)
        for name in ('x-ro', 'x-rw'):
            t.check_equal(after[name][2], seen['x'][2], f'the files of {name}, taken during the fold')
        t.check_equal(after['x'], seen['x'], 'x after the fold')
        t.check_equal(json.loads(out)['layers_folded'], 0, 'layers the reap folded (the pairs it was held at, '
                      'and the one the snapshots changed)')
        t.check_equal(layer_rows(store), rows | {store.show('x-rw')['top_layer']},
                      'layers after the reap (the one it built for the pair it left is gone)')
        for _ in range(2):
            store.reap()
        t.check_equal(state(store), after, 'subvolumes after the reaps that followed')
        store.fsck()


def run():
    t.require_fuse()
    sub = t.Subtests()
    sub.run('snapshots of a top never written', test_unwritten_above_shared)
    sub.run('written layers between snapshots', test_written_between)
    sub.run('one reap folds what deleted snapshots left', test_one_reap_folds)
    sub.run('fsck repairs a next inode number that is taken', test_fsck_next_ino)
    sub.run('usage during a fold, and after one was killed', test_usage_during_fold)
    sub.run('snapshots of a top never written during a fold', test_snapshot_during_fold)
    sub.run('random writes, snapshots, deletes and reaps', test_random)
    sub.check()


t.main(run)
