#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Every change of a mount is all or nothing. A script of operations (files
written, truncated, hole-punched, renamed over and exchanged, linked,
unlinked, their xattrs and modes changed, most on files of a snapshot's
lower layer, so that each first copies its row up; and snapshots of the
mounted subvolume, which its server takes) runs on a mount whose
server has one SQLite step interrupted, at a different point each run: a
read that fails alone, or a write that makes SQLite roll back the whole
transaction. Each operation is followed by an fsync. After the run the
store must be consistent (fsck), and the subvolume must hold exactly the
operations that succeeded, with the one that failed either wholly there or
wholly absent; once the server gave up, nothing after it. Each snapshot
holds what the subvolume held when it was taken.

Reads of a mount with a fault answer right or with an error, never with
other data (of a lower layer, say).

Store commands (create, snapshot, delete, reap, receive) run with a fault
too: each is done wholly or not at all, and no file is left that the
catalog does not know. A receive of two images is killed at each step of
its end, where they take their names: both are there after or neither. And cowboxd with a fault from its start on: a call that fails answers with
an error and a message, the calls after it work, and what a call did is
committed.

Writes to the pack files fail too, and syncs of them, which then leave
zeros where the records should be (as a disk that lost its cache): a file
whose fsync returned, even when tried again after one that failed, reads
back intact after a remount, and scrub finds nothing damaged.

  COWBOX_FAULT_RUNS=N             runs, each with its own point of failure (default 60)
  COWBOX_FAULT_SEED=N             replay one run
  COWBOX_FAULT_READ_RUNS=N        runs of reads (default 40)
  COWBOX_FAULT_READ_SEED=N        replay one of them
  COWBOX_FAULT_COMMAND_RUNS=N     runs of store commands (default 60)
  COWBOX_FAULT_COMMAND_SEED=N     replay one of them
  COWBOX_FAULT_DAEMON_RUNS=N      runs of cowboxd (default 20)
  COWBOX_FAULT_DAEMON_SEED=N      replay one of them
  COWBOX_FAULT_PACK_RUNS=N        runs of pack writes (default 40)
  COWBOX_FAULT_PACK_SEED=N        replay one of them
"""

import errno
import os
import random
import sqlite3
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as dt  # noqa: E402
import stream_test as st  # noqa: E402
from cowbox_test import KiB  # noqa: E402

J = os.path.join
BLOCK = 64 * KiB
# The script takes about this many steps of SQLite's programs on the top
# layer, mount and unmount included; faults are injected up to a bit past it.
STEPS = 21000
# And each store command about this many.
COMMAND_STEPS = {'create': 1000, 'snapshot': 400, 'snapshot-readonly': 400, 'delete': 220, 'reap': 6500,
                 'receive': 5000}
# And reading every file of a mount, from the mount on.
READ_STEPS = 2000
# And cowboxd, from its start to the end of the calls below; a fault in
# the second half of a call, where cowboxd announces the change it made,
# fails no call.
DAEMON_STEPS = 2150
# And the writes and syncs of packs by PACK_SCRIPT's mount.
PACK_IO_STEPS = 90


def data(seed, size):
    return t.random_bytes(size, seed) if seed % 2 else t.pattern_bytes(size, seed)


def make_base(root):
    os.mkdir(J(root, 'dir'))
    os.mkdir(J(root, 'dir', 'sub'))
    os.mkdir(J(root, 'empty'))
    t.write_file(J(root, 'small'), data(1, 700))
    t.write_file(J(root, 'big'), data(2, 3 * BLOCK + 1234))
    t.write_file(J(root, 'dir', 'a'), data(3, 5000))
    t.write_file(J(root, 'dir', 'sub', 'b'), data(4, 2 * BLOCK))
    t.write_file(J(root, 'victim'), data(5, 40 * KiB))
    os.setxattr(J(root, 'small'), 'user.tag', b'base')
    os.setxattr(J(root, 'big'), 'user.one', b'1')
    os.setxattr(J(root, 'big'), 'user.two', b'2' * 300)
    os.symlink('dir/a', J(root, 'link'))


def make_bases(store, base_dir):
    """The subvolume 'base' and the host directory base_dir, with the same
    tree."""
    store.create('base')
    with store.mount('base') as m:
        make_base(m.path)
    make_base(base_dir)


def write_at(path, offset, payload):
    fd = os.open(path, os.O_WRONLY)
    try:
        n = os.pwrite(fd, payload, offset)
        # One request: the kernel splits a write whose first page it writes
        # only in part, and each request is a change of its own.
        t.check(n == len(payload), f'a short write of {path}: {n} of {len(payload)} bytes')
        os.fsync(fd)
    finally:
        os.close(fd)


def create(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640))


def truncate(path, size):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def punch(path, offset, length):
    fd = os.open(path, os.O_WRONLY)
    try:
        t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, offset, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def clone_block(src, dst):
    """Shares src's first block with dst (one request)."""
    with open(src, 'rb') as fi, open(dst, 'r+b') as fo:
        n = os.copy_file_range(fi.fileno(), fo.fileno(), BLOCK, 0, 0)
        t.check(n == BLOCK, f'a short copy_file_range: {n} of {BLOCK} bytes')
        os.fsync(fo.fileno())


def synced(fn):
    """The operation, then an fsync of the root: its changes are committed."""
    def run(root):
        fn(root)
        t.fsync_dir(root)
    return run


# A snapshot of the mounted subvolume, which its server takes.
SNAPSHOT = object()

# Each is one request to the server (a change of its own: a system call
# the kernel splits into several is not all or nothing on any file system),
# and none depends on an earlier one having failed or not, beyond what the
# host replay reproduces.
SCRIPT = [
    ('write into a lower small file', lambda r: write_at(J(r, 'small'), 100, data(10, 200))),
    ('grow a small file into blocks', lambda r: write_at(J(r, 'small'), 5000, data(11, 3000))),
    ('overwrite across blocks', lambda r: write_at(J(r, 'big'), BLOCK - 8192, data(12, 16384))),
    ('shrink into a block', lambda r: truncate(J(r, 'big'), 2 * BLOCK + 77)),
    ('punch a hole', lambda r: punch(J(r, 'dir', 'sub', 'b'), 1000, BLOCK + 3000)),
    ('create', lambda r: create(J(r, 'new'))),
    ('write a new file', lambda r: write_at(J(r, 'new'), 0, data(13, 9000))),
    ('mkdir', lambda r: os.mkdir(J(r, 'made'))),
    ('symlink', lambda r: os.symlink('../big', J(r, 'made', 'up'))),
    ('hard link a lower file', lambda r: os.link(J(r, 'dir', 'a'), J(r, 'made', 'a2'))),
    ('create a clone', lambda r: create(J(r, 'cloned'))),
    ('clone a lower block', lambda r: clone_block(J(r, 'big'), J(r, 'cloned'))),
    ('snapshot', SNAPSHOT),
    ('rename over a lower file', lambda r: os.rename(J(r, 'new'), J(r, 'victim'))),
    ('exchange across directories',
     lambda r: t.renameat2(J(r, 'dir', 'a'), J(r, 'made', 'up'), t.RENAME_EXCHANGE)),
    ('rename a directory', lambda r: os.rename(J(r, 'dir', 'sub'), J(r, 'made', 'sub'))),
    ('set an xattr', lambda r: os.setxattr(J(r, 'big'), 'user.three', b'3' * 50)),
    ('replace an xattr', lambda r: os.setxattr(J(r, 'small'), 'user.tag', b'changed')),
    ('remove an xattr', lambda r: os.removexattr(J(r, 'big'), 'user.one')),
    ('chmod', lambda r: os.chmod(J(r, 'dir'), 0o711)),
    ('utime', lambda r: os.utime(J(r, 'link'), ns=(1_000_000_000, 2_000_000_000), follow_symlinks=False)),
    ('unlink a lower file', lambda r: os.unlink(J(r, 'made', 'a2'))),
    ('rmdir a lower directory', lambda r: os.rmdir(J(r, 'empty'))),
    ('another snapshot', SNAPSHOT),
    ('truncate to zero', lambda r: truncate(J(r, 'victim'), 0)),
    ('mknod a fifo', lambda r: os.mkfifo(J(r, 'fifo'))),
    ('append', lambda r: write_at(J(r, 'cloned'), 2 * BLOCK, data(14, 777))),
]


def replay(root, indices):
    for i in indices:
        if SCRIPT[i][1] is not SNAPSHOT:
            synced(SCRIPT[i][1])(root)


def matches(store, base_dir, name, candidates, what):
    """Whether subvolume name holds the base with one of the candidate
    lists of operations replayed on it; fails with the differences if not."""
    with store.mount(name, readonly=True) as m:
        got = t.manifest(m.path)
    differences = []
    for k, indices in enumerate(candidates):
        with t.temporary_directory(f'expected-{name}-{k}') as host:
            t.copy_tree(J(base_dir, '.'), host)
            try:
                replay(host, indices)
            except OSError:
                continue
            diffs = t.compare_manifests(got, t.manifest(host), label_a=name, label_b='expected',
                                        mtime=False, dir_mtime=False)
            if not diffs:
                return
            differences.append(f'with {indices}:\n    ' + '\n    '.join(diffs[:10]))
    t.fail(f'{what}: {name} holds neither the operations that succeeded nor those and the one that '
           f'failed; differences ' + '\n'.join(differences))


def run_step(store, name, i, what, fn, path):
    """Runs one step of the script on the mount; returns the errno it
    failed with (EIO for a snapshot that failed), or None."""
    if fn is SNAPSHOT:
        r = store.run('subvolume', 'snapshot', name, f'{name}-at-{i}', expect=None)
        t.check(r.code == 0 or (isinstance(r.code, int) and 1 <= r.code <= 125 and r.err.strip()),
                f'{what} failed, not cleanly:\n{r.describe()}')
        return None if r.code == 0 else errno.EIO
    try:
        synced(fn)(path)
    except OSError as e:
        return e.errno
    return None


def run_once(store, seed, base_dir):
    rng = random.Random(seed)
    step = rng.randint(1, STEPS)
    name = f'run-{seed}'
    store.snapshot('base', name)
    m = store.mount(name, env={'COWBOX_FAULT_SQL_STEP': str(step)})
    opened = m.mount(expect=None)
    applied, failed, dead = [], None, False
    if m.mounted:
        for i, (what, fn) in enumerate(SCRIPT):
            e = run_step(store, name, i, what, fn, m.path)
            if e is not None:
                if failed is None:
                    failed = i
                    print(f'  run {seed} (step {step}): {what}: {t.errno_name(e)}', flush=True)
                else:
                    print(f'  run {seed}: then {what}: {t.errno_name(e)}', flush=True)
                    dead = dead or e == errno.EIO
                continue
            t.check(not dead, f'run {seed}: {what} succeeded after the server gave up')
            applied.append(i)
        m.unmount()
        if dead:
            t.check(f"subvolume '{name}' failed: " in store.log(),
                    f'run {seed}: the server gave up and logged nothing:\n{store.log()}')
    else:
        t.check(isinstance(opened.code, int) and 1 <= opened.code <= 125 and opened.err.strip(),
                f'run {seed}: a failed mount must fail cleanly:\n{opened.describe()}')
        print(f'  run {seed} (step {step}): the mount failed: {opened.err.strip()}', flush=True)
        failed = -1

    store.fsck()
    what = f'run {seed} (fault at step {step}, operation {failed})'
    candidates = [applied]
    if failed is not None and failed >= 0:
        candidates.append(sorted(applied + [failed]))
    matches(store, base_dir, name, candidates, what)
    # Each snapshot, taken or not, holds what the subvolume held then.
    for i, (_, fn) in enumerate(SCRIPT):
        if fn is SNAPSHOT and f'{name}-at-{i}' in store.names():
            matches(store, base_dir, f'{name}-at-{i}', [[k for k in c if k < i] for c in candidates],
                    f'{what}, its snapshot')
            store.delete(f'{name}-at-{i}', reap=False)
    store.delete(name, reap=False)
    return failed is not None


def run_all(store, runs, run_one, what, steps_name):
    """Runs run_one(seed) for each seed, which says whether its fault was
    met; then the store must reap and check clean, and at least half the
    runs must have met their fault (or the steps reach too far)."""
    faulted = sum(run_one(seed) for seed in runs)
    store.reap()
    store.fsck()
    print(f'{faulted} of {len(runs)} runs failed {what}', flush=True)
    if len(runs) >= 10:
        t.check(faulted >= len(runs) // 2,
                f'only {faulted} of {len(runs)} runs met their fault: {steps_name} is too high')


def test_mount_changes():
    runs = t.seeds('COWBOX_FAULT_SEED', 'COWBOX_FAULT_RUNS', 60)
    with t.Store('faults') as store, t.temporary_directory('faults-base') as base_dir:
        make_bases(store, base_dir)
        with store.mount('base') as m:
            t.assert_trees_equal(m.path, base_dir, 'the base', mtime=False, dir_mtime=False)
        run_all(store, runs, lambda seed: run_once(store, seed, base_dir), 'an operation', 'STEPS')


def read_everything(root):
    """Every entry's answer to what readers ask (stat, list, read,
    readlink, xattrs), or the errno it gave, in walk order."""
    answers = []

    def ask(what, fn, *args):
        try:
            answers.append((what, fn(*args)))
        except OSError as e:
            answers.append((what, f'errno {t.errno_name(e.errno)}'))

    def stat_of(path):
        st = os.lstat(path)
        return (st.st_mode, st.st_size, st.st_nlink, st.st_mtime_ns)

    def xattrs_of(path):
        return sorted((n, os.getxattr(path, n, follow_symlinks=False))
                      for n in os.listxattr(path, follow_symlinks=False))

    stack = ['']
    while stack:
        rel = stack.pop()
        path = J(root, rel) if rel else root
        ask(f'stat {rel}', stat_of, path)
        ask(f'xattrs {rel}', xattrs_of, path)
        if os.path.islink(path):
            ask(f'readlink {rel}', os.readlink, path)
        elif os.path.isdir(path):
            try:
                names = sorted(os.listdir(path))
            except OSError as e:
                answers.append((f'list {rel}', f'errno {t.errno_name(e.errno)}'))
                continue
            answers.append((f'list {rel}', names))
            stack.extend(J(rel, n) if rel else n for n in reversed(names))
        else:
            ask(f'read {rel}', t.read_file, path)
    return answers


def test_reads():
    """Reads of a mount with a fault at a random point (in the metadata of
    either layer of a snapshot): every answer is the right one or an error,
    never other data, and the reads after the fault are right again."""
    runs = t.seeds('COWBOX_FAULT_READ_SEED', 'COWBOX_FAULT_READ_RUNS', 40)
    with t.Store('faults-reads') as store:
        store.create('base')
        with store.mount('base') as m:
            make_base(m.path)
        store.snapshot('base', 'two')
        with store.mount('two') as m:         # a second layer over the first
            write_at(m.p('big'), BLOCK, data(30, 4096))
            os.rename(m.p('victim'), m.p('dir', 'moved'))
            os.setxattr(m.p('small'), 'user.tag', b'two')
        with store.mount('two') as m:
            want = read_everything(m.path)
        t.check(not any(isinstance(a, str) and a.startswith('errno') for _, a in want),
                f'reading without a fault failed: {want}')
        want = dict(want)
        errors = 0
        for seed in runs:
            step = random.Random(seed).randint(1, READ_STEPS)
            m = store.mount('two', readonly=seed % 2 == 0, env={'COWBOX_FAULT_SQL_STEP': str(step)})
            opened = m.mount(expect=None)
            if not m.mounted:
                t.check(opened.err.strip(), f'run {seed}: a mount failed without a message')
                print(f'  run {seed} (step {step}): the mount failed', flush=True)
                errors += 1
                continue
            try:
                got = dict(read_everything(m.path))
            finally:
                m.unmount()
            failed = False
            for what, answer in got.items():
                t.check(what in want, f'run {seed} (step {step}): asked {what}, which is not there without a fault')
                if answer != want[what]:
                    t.check(isinstance(answer, str) and answer.startswith('errno'),
                            f'run {seed} (step {step}): {what} answered other data than without a fault')
                    failed = True
            if failed:
                print(f'  run {seed} (step {step}): ' + ', '.join(w for w, a in got.items() if a != want[w]), flush=True)
            # Only what a failed listing hid goes unasked.
            t.check(failed or got.keys() == want.keys(), f'run {seed} (step {step}): not everything was asked')
            errors += failed
        print(f'{errors} of {len(runs)} runs met their fault', flush=True)
        if len(runs) >= 10:
            t.check(errors >= len(runs) // 10, f'only {errors} of {len(runs)} runs met their fault: READ_STEPS is too high')


def run_command_with_fault(store, step, *args):
    """Runs a cowbox-store command with a fault; it succeeds or fails
    cleanly (an exit status of 1 to 125 and a message), never crashes.
    Returns whether it succeeded."""
    r = store.run(*args, expect=None, env={'COWBOX_FAULT_SQL_STEP': str(step)})
    t.check(isinstance(r.code, int) and 0 <= r.code <= 125, f'a command with a fault crashed:\n{r.describe()}')
    t.check(r.code == 0 or r.err.strip(), f'a command with a fault failed without a message:\n{r.describe()}')
    t.check('Sanitizer' not in r.err and 'runtime error' not in r.err, f'a sanitizer spoke:\n{r.describe()}')
    return r.code == 0


def image_stream():
    """A send stream of a small image: a directory, files written in
    several commands, a symlink, an xattr, modes and times."""
    body = [st.command('mkdir', ('path', 'd')),
            st.command('mkfile', ('path', 'd/f')),
            st.command('write', ('path', 'd/f'), ('file_offset', 0), ('data', data(20, 3000))),
            st.command('write', ('path', 'd/f'), ('file_offset', 3000), ('data', data(21, 5000))),
            st.command('mkfile', ('path', 'g')),
            st.command('write', ('path', 'g'), ('file_offset', 0), ('data', data(22, 40000))),
            st.command('set_xattr', ('path', 'g'), ('xattr_name', 'user.k'), ('xattr_data', b'v')),
            st.command('symlink', ('path', 'l'), ('ino', 9), ('path_link', 'd/f')),
            st.command('chmod', ('path', 'd/f'), ('mode', 0o600)),
            st.command('utimes', ('path', 'g'), ('atime', (1, 0)), ('mtime', (2, 0)), ('ctime', (3, 0)))]
    return st.simple_stream(name='image', uuid=b'\x42' * 16, body=body)


def receive_image(store):
    """Receives image_stream() as 'image'; returns the stream's file."""
    stream = J(store.tmp, 'image.stream')
    with open(stream, 'wb') as f:
        f.write(image_stream())
    store.run('receive', '-f', stream, 'image')
    return stream


def check_subvolume(store, name, want, what):
    with store.mount(name, readonly=True) as m:
        t.assert_manifests_equal(t.manifest(m.path), want, what, label_a=name, label_b='expected',
                                 mtime=False, dir_mtime=False)


def catalog_files(store):
    """The layer and pack files the catalog knows of, by file name stem."""
    db = sqlite3.connect(f'file:{J(store.path, "catalog.db")}?mode=ro', uri=True)
    try:
        layers = {str(row[0]) for row in db.execute('SELECT id FROM layers')}
        packs = {str(row[0]) for row in db.execute('SELECT id FROM packs')}
    finally:
        db.close()
    return layers, packs


def check_nothing_left_over(store):
    layers, packs = catalog_files(store)
    for sub, known in (('layers', layers), ('packs', packs)):
        for name in os.listdir(J(store.path, sub)):
            stem = name.split('.')[0].split('-')[0]
            t.check(stem in known, f'{sub}/{name} is left over: the catalog does not know it')


def test_store_commands():
    """Commands that change the store, each with a fault at a random point:
    each is wholly done or not at all, fsck finds the store consistent, and
    every subvolume holds what it held; in the end the reaper leaves no file
    the catalog does not know of."""
    runs = t.seeds('COWBOX_FAULT_COMMAND_SEED', 'COWBOX_FAULT_COMMAND_RUNS', 60)
    with t.Store('faults-commands') as store, t.temporary_directory('faults-commands-base') as base_dir:
        make_bases(store, base_dir)
        stream = receive_image(store)
        with store.mount('image', readonly=True) as m:
            want = {'base': t.manifest(base_dir), 'empty': {}, 'image': t.manifest(m.path)}
        t.check(len(want['image']) == 4, f'the image holds {sorted(want["image"])}')
        store.delete('image')
        contents = {'base': 'base'}     # subvolume -> what it holds
        done = 0
        for seed in runs:
            rng = random.Random(seed)
            kind = rng.choice(sorted(COMMAND_STEPS))
            step = rng.randint(1, COMMAND_STEPS[kind])
            others = sorted(n for n in contents if n != 'base')
            if kind in ('delete', 'reap') and not others:
                store.snapshot('base', f'pre-{seed}')
                contents[f'pre-{seed}'] = 'base'
                others = [f'pre-{seed}']
            before = dict(contents)
            after = dict(contents)
            if kind == 'create':
                args, name = ['subvolume', 'create', f'c-{seed}'], f'c-{seed}'
                after[name] = 'empty'
            elif kind.startswith('snapshot'):
                name = f's-{seed}'
                args = ['subvolume', 'snapshot'] + (['-r'] if kind == 'snapshot-readonly' else []) + ['base', name]
                after[name] = 'base'
            elif kind == 'receive':
                name = f'r-{seed}'
                args = ['receive', '-f', stream, name]
                after[name] = 'image'
            elif kind == 'delete':
                name = rng.choice(others)
                args = ['subvolume', 'delete', '--no-reap', name]
                del after[name]
            else:
                name = rng.choice(others)
                store.delete(name, reap=False)
                del before[name], after[name]
                args = ['reap', '--wait']
            ok = run_command_with_fault(store, step, *args)
            print(f'  run {seed}: {" ".join(args)}, a fault at step {step}: {"done" if ok else "failed"}', flush=True)
            done += ok
            store.fsck()
            names = store.names()
            t.check(names in (sorted(before), sorted(after)),
                    f'run {seed}: {" ".join(args)} with a fault at step {step} left {names}, neither '
                    f'{sorted(before)} nor {sorted(after)}')
            t.check(not ok or names == sorted(after), f'run {seed}: {" ".join(args)} succeeded but left {names}')
            contents = after if names == sorted(after) else before
            for n in {name, 'base'} & set(contents):
                check_subvolume(store, n, want[contents[n]], f'run {seed}: {n} after {" ".join(args)} '
                                f'with a fault at step {step}')
        print(f'{done} of {len(runs)} commands succeeded despite their fault', flush=True)
        if len(runs) >= 10:
            t.check(done <= len(runs) // 2, f'{done} of {len(runs)} commands met no fault: COMMAND_STEPS is too high')

        for n in contents:
            if n != 'base':
                store.delete(n, reap=False)
        store.reap()
        store.fsck()
        check_subvolume(store, 'base', want['base'], 'base in the end')
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after the last reap')
        check_nothing_left_over(store)


def small_image_stream(name, marker):
    return st.simple_stream(name=name, uuid=marker * 16, body=[
        st.command('mkfile', ('path', 'f')),
        st.command('write', ('path', 'f'), ('file_offset', 0), ('data', data(marker[0], 3000)))])


def test_receive_killed_while_naming():
    """An input of two images, its receive killed (SIGKILL, as kill -9)
    at every step of SQLite's work near its end, where the images take
    their names: afterwards, once the next receive has cleared what a dead
    one left, both images are there or neither, never one alone, and fsck
    finds the store consistent. COWBOX_FAULT_SQL_KILL turns the fault into
    the kill."""
    pair = ['pair-1', 'pair-2']
    with t.Store('faults-receive-kill') as store:
        for name, content in (('pair', small_image_stream('pair-1', b'\x51') + small_image_stream('pair-2', b'\x52')),
                              ('other', small_image_stream('other', b'\x53'))):
            with open(J(store.tmp, name), 'wb') as f:
                f.write(content)

        def killed_at(step):
            r = store.run('receive', '-f', J(store.tmp, 'pair'), expect=None,
                          env={'COWBOX_FAULT_SQL_STEP': str(step), 'COWBOX_FAULT_SQL_KILL': '1'})
            t.check(r.code in (0, -9), f'a receive with a kill at step {step}:\n{r.describe()}')
            # The next receive clears what a dead one left.
            store.run('receive', '-f', J(store.tmp, 'other'))
            names = store.names()
            for name in names:
                store.run('subvolume', 'delete', '--no-reap', name)
            return r.code == -9, [n for n in names if n != 'other']

        # The steps of the whole receive: killed before the last, not after.
        low, high = 1, 100000
        while low < high:
            middle = (low + high) // 2
            if killed_at(middle)[0]:
                low = middle + 1
            else:
                high = middle
        total = low
        t.check(1000 < total < 100000, f'a receive of two small images takes {total} steps')
        outcomes = set()
        for step in range(total - 60, total):
            killed, names = killed_at(step)
            t.check(killed, f'the receive was not killed at step {step} of {total}')
            t.check(names in ([], pair), f'a receive of two images killed at step {step} of {total} left {names}')
            outcomes.add(tuple(names))
            if step % 20 == 0:
                store.fsck()
        t.check_equal(sorted(outcomes), [(), tuple(pair)],
                      f'what kills in the last 60 of {total} steps left: the naming is not among them')
        store.reap()
        store.fsck()


# Calls to make of cowboxd, each with the change of names it makes.
DAEMON_CALLS = [
    (['snapshot', 'image', 'w'], {'add': 'w'}),
    (['snapshot', '-r', 'image', 'r'], {'add': 'r'}),
    (['image', 'rename', 'r', 'r2'], {'rename': ('r', 'r2')}),
    (['rm', 'w'], {'remove': 'w'}),
    (['snapshot', 'image', 'w2'], {'add': 'w2'}),
]


def apply_call(names, change):
    names = set(names)
    if 'add' in change:
        names.add(change['add'])
    if 'remove' in change:
        names.discard(change['remove'])
    if 'rename' in change and change['rename'][0] in names:
        names.discard(change['rename'][0])
        names.add(change['rename'][1])
    return sorted(names)


def daemon_fault_step(seed):
    """Consecutive seeds take their steps from consecutive tenths of
    DAEMON_STEPS: ten runs spread over the start and every call."""
    width = DAEMON_STEPS // 10
    return seed % 10 * width + random.Random(seed).randint(1, width)


def test_daemon_calls():
    """cowboxd with a fault at a random point, from its start on: a call
    that fails answers with an error and a message, the daemon goes on
    serving and the calls after it work, each call is done wholly or not at
    all and durably, and the store stays consistent."""
    dt.require_dbus()
    runs = t.seeds('COWBOX_FAULT_DAEMON_SEED', 'COWBOX_FAULT_DAEMON_RUNS', 20)
    with t.Store('faults-daemon') as store:
        receive_image(store)
        failed_calls = 0
        for seed in runs:
            step = daemon_fault_step(seed)
            names = store.names()
            bus = dt.Bus(store)
            daemon = dt.Daemon(store, bus, env={'COWBOX_FAULT_SQL_STEP': str(step)})
            try:
                try:
                    daemon.start()
                except t.Failure:
                    t.check(daemon.proc.poll() not in (None, 0), f'run {seed}: cowboxd neither started nor exited')
                    print(f'  run {seed} (step {step}): cowboxd did not start', flush=True)
                    continue
                faulted = False
                for argv, change in DAEMON_CALLS:
                    r = dt.cowbox(bus, *argv, expect=None)
                    t.check(daemon.proc.poll() is None, f'run {seed} (step {step}): cowboxd exited after '
                            f'{" ".join(argv)}:\n{open(daemon.log).read()[-2000:]}')
                    listed = store.names()     # what is committed, read by another process
                    if r.code == 0:
                        t.check_equal(listed, apply_call(names, change), f'run {seed}: names after {" ".join(argv)}')
                    else:
                        faulted = True
                        failed_calls += 1
                        print(f'  run {seed} (step {step}): {" ".join(argv)}: {r.err.strip()}', flush=True)
                        t.check(r.err.strip(), f'run {seed}: {" ".join(argv)} failed without a message')
                        t.check('Input/output error' not in r.err or 'nothing was changed' in r.err,
                                f'run {seed}: {" ".join(argv)} failed with a bare errno: {r.err.strip()}')
                        t.check(listed in (names, apply_call(names, change)),
                                f'run {seed}: {" ".join(argv)} failed and left {listed}')
                    names = listed
                if faulted:
                    # The fault is spent: cowboxd must work as before.
                    dt.cowbox(bus, 'snapshot', 'image', 'after')
                    names = apply_call(names, {'add': 'after'})
                    t.check_equal(store.names(), names, f'run {seed}: names after a snapshot that followed the fault')
            finally:
                daemon.stop()
                bus.stop()
            store.fsck()
            t.check_equal(store.names(), names, f'run {seed}: the names after cowboxd stopped')
            for n in set(names) - {'image'}:
                store.delete(n)
        if len(runs) >= 10:
            t.check(failed_calls > 0, f'no call of {len(runs)} runs met its fault: DAEMON_STEPS is too high')


def pack_versions(seed):
    """The versions each file of the pack script is written with, in order:
    (file, data), incompressible and unique, so that every version is new
    blocks; small packs make new pack files on the way."""
    rng = random.Random(seed)
    versions = []
    for k in range(40):
        name = f'f{rng.randrange(12)}'
        size = rng.choice([700, 5000, 40 * KiB, BLOCK + 3000, 3 * BLOCK])
        versions.append((name, t.random_bytes(size, seed * 1000 + k)))
    return versions


def write_synced(path, payload):
    """Writes a version and fsyncs it; an fsync that fails is tried once
    more, as programs do: whether that one returns is what counts.
    Returns the first error and the last, or None for each."""
    try:
        t.write_file(path, payload)
    except OSError as e:
        return e.errno, e.errno
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            os.fsync(fd)
            return None, None
        except OSError as e:
            first = e.errno
        try:
            os.fsync(fd)
            return first, None
        except OSError as e:
            return first, e.errno
    finally:
        os.close(fd)


def run_pack_faults(store, seed):
    rng = random.Random(seed)
    step = rng.randint(1, PACK_IO_STEPS)
    name = f'packs-{seed}'
    store.create(name)
    env = {'COWBOX_FAULT_PACK_IO': str(step), 'COWBOX_PACK_MAX_BYTES': str(256 * KiB)}
    versions = pack_versions(seed)
    history = {}          # file -> versions written, in order
    acknowledged = {}     # file -> index in history of the last version whose fsync returned
    failures = []
    with store.mount(name, env=env) as m:
        for k, (f, payload) in enumerate(versions):
            history.setdefault(f, []).append(payload)
            first, last = write_synced(J(m.path, f), payload)
            if last is None:
                acknowledged[f] = len(history[f]) - 1
            if first is not None:
                failures.append(f'version {k} of {f}: {t.errno_name(first)}'
                                f'{", then " + t.errno_name(last) if last else ", then done"}')
    what = f'run {seed} (pack I/O fault {step})'
    print(f'  {what}: {len(failures)} writes failed{": " + failures[0] if failures else ""}', flush=True)
    if any(not f.endswith('then done') for f in failures):
        # Only a failed sync fails a write for good: the server says so.
        log = store.log()
        t.check(f"subvolume '{name}' failed: a sync of the pack" in log and 'a sync of pack' in log,
                f'{what}: the log does not say why the mount failed:\n{log}')
    store.fsck()
    r = store.run('scrub', expect=None)
    t.check(r.code == 0, f'{what}: scrub found damage:\n{r.describe()}')
    with store.mount(name, readonly=True) as m:
        for f, written in sorted(history.items()):
            path = J(m.path, f)
            try:
                got = t.read_file(path)
            except FileNotFoundError:
                t.check(f not in acknowledged, f'{what}: {f}, acknowledged, is gone')
                continue
            except OSError as e:
                t.fail(f'{what}: {f} cannot be read: {t.errno_name(e.errno)}')
            # What was acknowledged last, or a version written after it.
            allowed = written[acknowledged.get(f, 0):]
            t.check(got in allowed, f'{what}: {f} holds {len(got)} bytes, none of the versions it may hold '
                    f'(acknowledged: version {acknowledged.get(f)} of {len(written)})')
    store.delete(name, reap=False)
    return bool(failures)


def test_pack_io():
    runs = t.seeds('COWBOX_FAULT_PACK_SEED', 'COWBOX_FAULT_PACK_RUNS', 40)
    with t.Store('faults-packs') as store:
        run_all(store, runs, lambda seed: run_pack_faults(store, seed), 'a write', 'PACK_IO_STEPS')


def test_faults():
    t.require_root('FUSE mounts')
    t.require_fuse()
    sub = t.Subtests()
    sub.run('changes of a mount', test_mount_changes)
    sub.run('reads of a mount', test_reads)
    sub.run('store commands', test_store_commands)
    sub.run('a receive of two images killed while it names them', test_receive_killed_while_naming)
    sub.run('calls of cowboxd', test_daemon_calls)
    sub.run('pack writes of a mount', test_pack_io)
    sub.check()


if __name__ == '__main__':
    t.main(test_faults)
