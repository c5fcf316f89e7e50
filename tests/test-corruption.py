#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Silent corruption becomes EIO, never wrong data: one byte flipped in a pack
file makes reads of the file that uses it fail with EIO, the other files
read correctly, and scrub reports the damaged file (exit status 1), while
scrub of an undamaged store exits 0."""

import errno
import glob
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

J = os.path.join
CHUNK = 64 * KiB
NEEDLE_OFFSET = 200 * KiB   # where in the victim the flipped byte's neighbourhood starts
FLIPPED_CHUNK = (NEEDLE_OFFSET + 32) // CHUNK * CHUNK
# Distinct names, so that a report naming one cannot be taken for another.
FILES = ['alpha-7f3a.bin', 'bravo-21c9.bin', 'charlie-e04d.bin', 'delta-9b6e.bin']


def contents():
    return {name: t.random_bytes(384 * KiB + i * 4099, 500 + i) for i, name in enumerate(FILES)}


def pack_files(store):
    packs = glob.glob(J(store.path, 'packs', '*.pack'))
    if not packs:
        listing = '\n'.join(os.path.relpath(J(d, f), store.path)
                            for d, _, fs in os.walk(store.path) for f in fs)
        t.fail(f'no pack files in {store.path}/packs; the store holds:\n{listing}')
    return packs


def flip_byte(store, data):
    """Flips one byte of the stored payload of the victim file (found by its
    content, since random data is stored uncompressed); if the content
    cannot be found, the byte in the middle of the largest pack file.
    Returns the victim's name, or None when it is not known."""
    victim = FILES[1]
    needle = data[victim][NEEDLE_OFFSET:NEEDLE_OFFSET + 64]
    for pack in sorted(pack_files(store)):
        with open(pack, 'rb') as f:
            blob = f.read()
        at = blob.find(needle)
        if at >= 0:
            where = at + 32
            with open(pack, 'r+b') as f:
                f.seek(where)
                f.write(bytes([blob[where] ^ 0x40]))
            print(f'flipped the byte at {where} of {os.path.basename(pack)}, inside {victim}', flush=True)
            return victim
    pack = max(pack_files(store), key=os.path.getsize)
    where = os.path.getsize(pack) // 2
    with open(pack, 'r+b') as f:
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0x40]))
    print(f'content not found in the packs (compressed or transformed?): flipped the byte at {where} '
          f'of {os.path.basename(pack)}, {os.path.getsize(pack)} bytes', flush=True)
    return None


def read_checked(path, expected):
    """Reads in chunks; returns the offsets that gave EIO. Every byte that is
    returned must be the right one."""
    bad = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for off in range(0, len(expected), CHUNK):
            try:
                got = os.pread(fd, CHUNK, off)
            except OSError as e:
                if e.errno != errno.EIO:
                    t.fail(f'{path} at {off}: {e}, expected EIO or the data')
                bad.append(off)
                continue
            t.check_bytes(got, expected[off:off + CHUNK], f'{os.path.basename(path)} at offset {off}')
    finally:
        os.close(fd)
    return bad


def run():
    t.require_fuse()
    data = contents()
    with t.Store('corruption') as store:
        store.create('victims')
        store.create('bystander')
        with store.mount('victims') as m:
            for name, content in data.items():
                t.write_file(m.p(name), content, fsync=True)
        with store.mount('bystander') as m:
            t.write_file(m.p('other.bin'), t.random_bytes(300 * KiB, 99), fsync=True)
        r = store.run('scrub')
        print(f'scrub of an undamaged store:\n{r.out}', flush=True)

        victim = flip_byte(store, data)

        with store.mount('victims', readonly=True) as m:
            damaged = {}
            for name, content in data.items():
                bad = read_checked(m.p(name), content)
                if bad:
                    damaged[name] = bad
            # (A read request of the kernel may span more than the damaged
            # block, so neighbouring chunks may fail too.)
            print(f'chunks with EIO: {damaged}', flush=True)
            if victim:
                t.check_equal(sorted(damaged), [victim], 'files that give EIO')
                t.check(FLIPPED_CHUNK in damaged[victim],
                        f'{victim}: the chunk at {FLIPPED_CHUNK}, which holds the flipped byte, read without error')
                # A second read fails again: nothing wrong was cached.
                t.check(FLIPPED_CHUNK in read_checked(m.p(victim), data[victim]),
                        f'{victim}: the damaged chunk read without error the second time')
            else:
                t.check_equal(len(damaged), 1, 'files that give EIO after one byte was flipped')
            victim = victim or next(iter(damaged))
            # The whole file read at once fails, as cat or cp would see it.
            t.expect_errno(errno.EIO, t.read_file, m.p(victim), what=f'reading all of {victim}')
        usage = store.usage()
        t.check(usage['corruption_events'] >= 1, f'corruption_events {usage["corruption_events"]} after EIO')

        r = store.run('scrub', expect=1)
        report = r.output
        print(f'scrub of the damaged store:\n{report}', flush=True)
        t.check(victim in report, f'scrub does not name the damaged file {victim}:\n{r.describe()}')
        t.check('victims' in report, f'scrub does not name the subvolume "victims":\n{r.describe()}')
        for name in FILES:
            if name != victim:
                t.check(name not in report, f'scrub names {name}, which is intact:\n{r.describe()}')
        t.check('other.bin' not in report, f'scrub names other.bin, which is intact:\n{r.describe()}')

        with store.mount('bystander') as m:
            t.check_bytes(t.read_file(m.p('other.bin')), t.random_bytes(300 * KiB, 99), 'a file of another subvolume')


t.main(run)
