#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Damage of every kind in the pack files: a zeroed range inside a
compressed block, a flipped byte in a record's header, a pack truncated
through a record, and a damaged block that two files share. Reads of the
damaged blocks give EIO and never other bytes, the undamaged parts and files
read correctly, the mounts' servers log each damaged block they met, and
scrub names exactly the damaged files, in each subvolume that uses them.
Writing a damaged file again from a good copy heals it, and every file that
shares its blocks. scrub names no file whose layer above rewrote a damaged
block, and names the files of a block the index lacks."""

import errno
import os
import re
import sqlite3
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

J = os.path.join
BLOCK = 64 * KiB
HEADER = 48     # bytes of a record's header before its payload


def block_locations(store, layer_ids, name):
    """(pack, offset, stored_len) of each block of the file called name in
    the root of a subvolume, read from the store's own databases."""
    for layer in layer_ids:
        path = J(store.path, 'layers', f'{layer}.db')
        if not os.path.exists(path):
            continue
        db = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
        row = db.execute('SELECT ino FROM dentries WHERE parent = 1 AND name = ?', (name.encode(),)).fetchone()
        if not row:
            db.close()
            continue
        digests = [d for (d,) in db.execute(
            'SELECT digest FROM extents WHERE ino = ? AND digest IS NOT NULL ORDER BY idx', (row[0],))]
        db.close()
        catalog = sqlite3.connect(f"file:{J(store.path, 'catalog.db')}?mode=ro", uri=True)
        locations = [catalog.execute('SELECT pack, offset, stored_len FROM blocks WHERE digest = ?',
                                     (d,)).fetchone() for d in digests]
        catalog.close()
        t.check(all(locations), f'{name}: a block of its extents is missing from the index')
        return locations
    t.fail(f'{name} is in no layer of the subvolume')


def damage_inline(store, layer, name):
    db = sqlite3.connect(J(store.path, 'layers', f'{layer}.db'))
    ino, data = db.execute('SELECT i.ino, i.data FROM dentries d JOIN inodes i ON i.ino = d.ino '
                           'WHERE d.parent = 1 AND d.name = ?', (name.encode(),)).fetchone()
    t.check(data is not None, f'{name} is not stored inline')
    data = bytearray(data)
    data[len(data) // 2] ^= 0x20
    db.execute('UPDATE inodes SET data = ? WHERE ino = ?', (bytes(data), ino))
    db.commit()
    db.close()


def top_layer(store, subvolume):
    return store.show(subvolume)['top_layer']


def pack_path(store, pack):
    return J(store.path, 'packs', f'{pack}.pack')


def damage(store, pack, offset, data):
    with open(pack_path(store, pack), 'r+b') as f:
        f.seek(offset)
        f.write(data)


def read_chunks(path, expected):
    """The block offsets that give EIO; every byte returned must be right."""
    bad = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for off in range(0, len(expected), BLOCK):
            try:
                got = os.pread(fd, BLOCK, off)
            except OSError as e:
                t.check(e.errno == errno.EIO, f'{path} at {off}: {e}, expected EIO or the data')
                bad.append(off)
                continue
            t.check_bytes(got, expected[off:off + BLOCK], f'{os.path.basename(path)} at offset {off}')
    finally:
        os.close(fd)
    return bad


def read_or_fail(path, expected):
    """As read_chunks; a damaged inline file fails as a whole, even to open."""
    try:
        return read_chunks(path, expected)
    except OSError as e:
        t.check(e.errno == errno.EIO, f'{path}: {e}, expected EIO or the data')
        return [0]


def test_scrub_names_users():
    """scrub names the files that use a damaged block, and only those: not
    a file whose layer above rewrote that block; and it names the files of
    a block the index lacks."""
    with t.Store('damage-users') as store:
        store.create('main')
        old, other = t.random_bytes(2 * BLOCK, 21), t.random_bytes(2 * BLOCK, 22)
        with store.mount('main') as m:
            t.write_file(m.p('rewritten.bin'), old, fsync=True)
            t.write_file(m.p('other.bin'), other, fsync=True)
        store.snapshot('main', 'before', readonly=True)
        new = t.random_bytes(BLOCK, 23)
        with store.mount('main') as m:
            with open(m.p('rewritten.bin'), 'r+b') as f:
                f.write(new)
                os.fsync(f.fileno())
        pack, offset, stored = block_locations(store, [top_layer(store, 'before')], 'rewritten.bin')[0]
        damage(store, pack, offset + HEADER + stored // 2, b'\x00\x01\x02\x03')
        r = store.run('scrub', expect=1)
        t.check(re.search(r'Subvolume: +before\n +Path: +/rewritten.bin\n', r.output)
                and not re.search(r'Subvolume: +main\n +Path: +/rewritten.bin\n', r.output),
                f'scrub of a block that main rewrote and its snapshot still uses:\n{r.output}')
        with store.mount('main', readonly=True) as m:
            t.check_equal(read_or_fail(m.p('rewritten.bin'), new + old[BLOCK:]), [], 'main/rewritten.bin')

        # The index loses the row of other.bin's second block.
        digest = sqlite3.connect(f"file:{J(store.path, 'layers', str(top_layer(store, 'before')) + '.db')}?mode=ro",
                                 uri=True).execute(
            'SELECT e.digest FROM extents e JOIN dentries d ON d.ino = e.ino '
            'WHERE d.parent = 1 AND d.name = ? AND e.idx = 1', (b'other.bin',)).fetchone()[0]
        catalog = sqlite3.connect(J(store.path, 'catalog.db'))
        t.check_equal(catalog.execute('DELETE FROM blocks WHERE digest = ?', (digest,)).rowcount, 1,
                      'index rows of the block removed')
        catalog.commit()
        catalog.close()
        r = store.run('scrub', expect=1)
        for subvolume in ('main', 'before'):
            t.check(re.search(rf'Subvolume: +{subvolume}\n +Path: +/other.bin\n +Problem: +block missing from the index',
                              r.output), f'scrub of a block the index lacks, in {subvolume}:\n{r.output}')


def run():
    t.require_fuse()
    test_scrub_names_users()
    files = {
        'zeroed-compressible.txt': t.pattern_bytes(5 * BLOCK, 1),
        'header-flipped.bin': t.random_bytes(3 * BLOCK, 2),
        'truncated-last.bin': t.random_bytes(4 * BLOCK + 1000, 3),
        'shared-one.bin': t.random_bytes(2 * BLOCK, 4),
        'shared-two.bin': t.random_bytes(2 * BLOCK, 4),       # the same blocks, stored once
        'intact-one.bin': t.random_bytes(3 * BLOCK, 5),
        'intact-two.txt': t.pattern_bytes(3 * BLOCK, 6),
        'small-inline.txt': t.pattern_bytes(3000, 7),          # kept in the layer's database
        'small-intact.txt': t.pattern_bytes(2000, 8),
    }
    with t.Store('damage') as store:
        store.create('main')
        with store.mount('main') as m:
            # The file to be cut off at the end of the pack is written last.
            for name in sorted(files, key=lambda n: n == 'truncated-last.bin'):
                t.write_file(m.p(name), files[name], fsync=True)
        store.snapshot('main', 'copy', readonly=True)
        store.run('scrub')

        layers = [top_layer(store, 'copy')]
        where = {name: block_locations(store, layers, name) for name in files if not name.startswith('small-')}
        t.check_equal(where['shared-one.bin'], where['shared-two.bin'], 'blocks of two identical files')

        damaged = [where['zeroed-compressible.txt'][2], where['header-flipped.bin'][0],
                   where['truncated-last.bin'][-1], where['shared-one.bin'][1]]
        # A range of zeros inside the payload of the third block.
        pack, offset, stored = where['zeroed-compressible.txt'][2]
        t.check(stored < BLOCK // 2, f'the compressible file was stored in {stored} byte blocks, not compressed')
        damage(store, pack, offset + HEADER + stored // 3, bytes(min(100, stored // 3)))
        # One byte of the header of the first block.
        pack, offset, stored = where['header-flipped.bin'][0]
        damage(store, pack, offset + 10, b'\xff')
        # The pack cut inside the last block of the file written last.
        pack, offset, stored = where['truncated-last.bin'][-1]
        # Packs are written in whole 4 KiB pages: zeros pad the last one.
        size = os.path.getsize(pack_path(store, pack))
        t.check(size - 4096 < offset + HEADER + stored <= size and size % 4096 == 0,
                f'the last block written ends at {offset + HEADER + stored}, in the last page of its pack ({size})')
        os.truncate(pack_path(store, pack), offset + HEADER + stored // 2)
        # The second block of the two identical files.
        pack, offset, stored = where['shared-one.bin'][1]
        damage(store, pack, offset + HEADER + stored // 2, b'\x00\x01\x02\x03')

        # A byte of a small file's content in the layer's database, behind
        # SQLite's back, as a failing disk would.
        damage_inline(store, layers[0], 'small-inline.txt')

        expected_bad = {
            'small-inline.txt': [0],
            'zeroed-compressible.txt': [2 * BLOCK],
            'header-flipped.bin': [0],
            'truncated-last.bin': [4 * BLOCK],
            'shared-one.bin': [BLOCK],
            'shared-two.bin': [BLOCK],
        }
        for subvolume in ('main', 'copy'):
            with store.mount(subvolume, readonly=True) as m:
                for name, content in sorted(files.items()):
                    bad = read_or_fail(m.p(name), content)
                    t.check_equal(bad, expected_bad.get(name, []), f'{subvolume}/{name}: blocks that give EIO')
        log = store.log()
        for pack, offset, _ in damaged:
            t.check(f'(pack {pack}, offset {offset}) is damaged' in log,
                    f'the log names no damage of the block in pack {pack} at {offset}:\n{log}')

        r = store.run('scrub', expect=1)
        report = r.output
        print(report, flush=True)
        for name in files:
            mentions = report.count(name)
            if name in expected_bad:
                # Named once for each subvolume that uses it.
                t.check_equal(mentions, 2, f'times scrub names the damaged {name}')
            else:
                t.check_equal(mentions, 0, f'times scrub names the intact {name}')
        # And says what is wrong with each: the stored bytes changed (also
        # where reads catch it only by the content's digest), a header, or a
        # record cut short.
        for name, problem in (('zeroed-compressible.txt', 'data checksum mismatch'),
                              ('shared-one.bin', 'data checksum mismatch'),
                              ('header-flipped.bin', 'header checksum mismatch'),
                              ('truncated-last.bin', 'truncated record')):
            t.check(re.search(rf'Path: +/{re.escape(name)}\n +Problem: +{problem}\n', report),
                    f'scrub does not give {name}\'s damage as "{problem}"')
        usage = store.usage()
        t.check(usage['corruption_events'] >= len(expected_bad), f"corruption events: {usage['corruption_events']}")
        store.fsck()

        # As scrub advises, the damaged files are written again from a good
        # copy: the store keeps each block once, but not a damaged one. The
        # bytes are stored anew, and every file that shares them, in every
        # subvolume, reads again.
        with store.mount('main') as m:
            for name in ('zeroed-compressible.txt', 'header-flipped.bin', 'shared-one.bin'):
                os.unlink(m.p(name))
                t.write_file(m.p(name + '.restored'), files[name], fsync=True)
        with store.mount('main', readonly=True) as m:
            for name in ('zeroed-compressible.txt', 'header-flipped.bin', 'shared-one.bin'):
                t.check_equal(read_or_fail(m.p(name + '.restored'), files[name]), [],
                              f'main/{name} written again from a good copy: blocks that give EIO')
            t.check_equal(read_or_fail(m.p('shared-two.bin'), files['shared-two.bin']), [],
                          'main/shared-two.bin, which shares the block written again')
        with store.mount('copy', readonly=True) as m:
            for name in ('zeroed-compressible.txt', 'header-flipped.bin', 'shared-one.bin', 'shared-two.bin'):
                t.check_equal(read_or_fail(m.p(name), files[name]), [],
                              f'copy/{name}, once its blocks were written again in main')
        r = store.run('scrub', expect=1)
        for name in ('zeroed-compressible.txt', 'header-flipped.bin', 'shared-one.bin', 'shared-two.bin'):
            t.check(name not in r.output, f'scrub still names {name} once it was written again:\n{r.output}')

        # Blocks freed are forgotten as damaged too.
        catalog = J(store.path, 'catalog.db')
        t.check(sqlite3.connect(catalog).execute('SELECT count(*) FROM damaged_blocks').fetchone()[0] > 0,
                'blocks remembered as damaged')
        store.delete('main', reap=False)
        store.delete('copy', reap=False)
        store.reap()
        t.check_equal(sqlite3.connect(catalog).execute('SELECT count(*) FROM damaged_blocks').fetchone()[0], 0,
                      'blocks remembered as damaged once nothing uses them')


t.main(run)
