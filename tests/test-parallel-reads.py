#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Many readers at once, each time on a freshly mounted subvolume (nothing
in the page cache, no block location remembered by the server), while a
writer commits new blocks: every file reads back exactly and the server
stays up. Reads fetch and decompress blocks without the volume's lock, so
this is where the threads of one server meet in the catalog. Mounted by
root, the mount reads ahead 2 MiB (the kernel's default for FUSE is 128
KiB), so that one reader's blocks come as READs served at once."""

import hashlib
import os
import sys
import threading

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402

J = os.path.join
MiB = 1 << 20
FILE_SIZE = 8 * MiB
N_FILES = 6


def read_digest(path, errors):
    try:
        return t.sha256_file(path)
    except OSError as e:
        errors.append(f'reading {path}: {e}')
        return None


def read_ahead_kb(path):
    st = os.stat(path)
    with open(f'/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb') as f:
        return int(f.read())


def write_new_blocks(path, stop, errors):
    """Keeps committing blocks new to the store until told to stop."""
    n = 0
    try:
        while not stop.is_set():
            t.write_file(path, t.random_bytes(MiB, f'writer-{n}'), fsync=True)
            n += 1
    except OSError as e:
        errors.append(f'writing {path}: {e}')


def run():
    t.require_fuse()
    rounds = t.env_int('COWBOX_PARALLEL_READ_ROUNDS', 4)
    files = {}
    for i in range(N_FILES):
        files[f'f{i}'] = t.random_bytes(FILE_SIZE, f'file-{i}') if i % 2 else t.pattern_bytes(FILE_SIZE, i)
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

    with t.Store('parallel-reads') as store:
        store.create('main')
        with store.mount('main') as m:
            for name, data in files.items():
                t.write_file(m.p(name), data, fsync=True)
        del files

        for r in range(rounds):
            with store.mount('main') as m:
                if r == 0 and os.geteuid() == 0:
                    t.check_equal(read_ahead_kb(m.path), 2048, 'read-ahead of the mount, KiB')
                errors, digests = [], {}
                stop = threading.Event()
                writer = threading.Thread(target=write_new_blocks, args=(m.p('scratch'), stop, errors))
                writer.start()

                def reader(name):
                    digests[name] = read_digest(m.p(name), errors)
                readers = [threading.Thread(target=reader, args=(name,)) for name in expected]
                for th in readers:
                    th.start()
                for th in readers:
                    th.join()
                stop.set()
                writer.join()

                t.check(not errors, f'round {r}: ' + '; '.join(errors))
                for name, digest in expected.items():
                    t.check_equal(digests[name], digest, f'round {r}: contents of {name}')
                t.check(t.is_mounted(m.path) and os.path.exists(m.p('f0')),
                        f'round {r}: the server went away')
        store.run('fsck')


if __name__ == '__main__':
    t.main(run)
