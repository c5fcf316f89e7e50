#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Damaged metadata records: a layer's rows changed behind SQLite's back, as
a failing disk would change them (SQLite checksums none of its pages). An
inode's attributes, an extent, an xattr, a directory entry and a block
reference count each carry a checksum: what uses a damaged one gets EIO,
never the damaged values; scrub names exactly the files concerned, in each
subvolume, and exits 1; fsck reports the damage. Folding the damaged layer
into its child must not give the damage a valid checksum, and the reaper
must not free a block in use when the record that counts it is damaged.
Layers written before records had checksums are read as they are, and get
checksums once they are opened for writing. A layer whose database is lost
is named as such, and nothing takes it for an empty one."""

import ctypes
import ctypes.util
import errno
import os
import re
import sqlite3
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

J = os.path.join
BLOCK = 64 * KiB
TABLES = ('info', 'inodes', 'dentries', 'xattrs', 'extents', 'blockrefs')


def layer_db(store, layer):
    return sqlite3.connect(J(store.path, 'layers', f'{layer}.db'))


def ino_of(db, parent, name):
    row = db.execute('SELECT ino FROM dentries WHERE parent = ? AND name = ?', (parent, name.encode())).fetchone()
    t.check(row, f'{name} is not in the layer')
    return row[0]


def expect_eio(what, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        t.check_equal(errno.errorcode.get(e.errno), 'EIO', f'{what}: error')
        return
    t.fail(f'{what} succeeded on a damaged record, expected EIO')


def read_blocks(path, expected):
    """The block offsets that give EIO; every byte returned must be right."""
    bad = []
    with open(path, 'rb', buffering=0) as f:
        for off in range(0, len(expected), BLOCK):
            try:
                got = os.pread(f.fileno(), BLOCK, off)
            except OSError as e:
                t.check_equal(errno.errorcode.get(e.errno), 'EIO', f'{path} at {off}: error')
                bad.append(off)
                continue
            t.check_bytes(got, expected[off:off + BLOCK], f'{os.path.basename(path)} at offset {off}')
    return bad


FILES = {
    'attrs.bin': t.random_bytes(2 * BLOCK, 1),
    'extent.bin': t.random_bytes(3 * BLOCK, 2),
    'xattr.txt': t.pattern_bytes(3000, 3),
    'intact.bin': t.random_bytes(3 * BLOCK, 4),
    'intact.txt': t.pattern_bytes(2000, 5),
}
ENTRIES = [f'entry-{i}' for i in range(5)]


def populate(m):
    for name, content in sorted(FILES.items()):
        t.write_file(m.p(name), content, fsync=True)
    os.setxattr(m.p('xattr.txt'), 'user.note', b'a note')
    os.setxattr(m.p('intact.txt'), 'user.note', b'another note')
    os.mkdir(m.p('listing'))
    for name in ENTRIES:
        t.write_file(m.p('listing', name), name.encode(), fsync=True)
    t.fsync_dir(m.p('listing'))
    t.fsync_dir(m.p(''))


def damage_records(store, layer):
    """Changes one value of each kind of record, leaving its check as it was."""
    db = layer_db(store, layer)
    attrs = ino_of(db, 1, 'attrs.bin')
    extent = ino_of(db, 1, 'extent.bin')
    xattr = ino_of(db, 1, 'xattr.txt')
    intact = ino_of(db, 1, 'intact.bin')
    listing = ino_of(db, 1, 'listing')
    changes = [
        ('UPDATE inodes SET uid = uid + 1 WHERE ino = ?', (attrs,)),
        ('UPDATE extents SET len = len - 1 WHERE ino = ? AND idx = 1', (extent,)),
        ("UPDATE xattrs SET value = X'4120766f7465' WHERE ino = ? AND name = CAST('user.note' AS BLOB)", (xattr,)),
        ("UPDATE dentries SET type = type + 1 WHERE parent = ? AND name = CAST('entry-2' AS BLOB)", (listing,)),
        # The count of a block of a file that stays intact gets another
        # digest: the reaper must still keep that block.
        ('UPDATE blockrefs SET digest = zeroblob(16) WHERE digest = '
         '(SELECT digest FROM extents WHERE ino = ? AND idx = 0)', (intact,)),
    ]
    for sql, args in changes:
        t.check_equal(db.execute(sql, args).rowcount, 1, f'rows changed by {sql}')
    db.commit()
    db.close()


def check_reads(m, subvolume):
    expect_eio(f'{subvolume}: stat of attrs.bin (inode record damaged)', os.stat, m.p('attrs.bin'))
    t.check_equal(read_blocks(m.p('extent.bin'), FILES['extent.bin']), [BLOCK],
                  f'{subvolume}/extent.bin: blocks that give EIO')
    expect_eio(f'{subvolume}: getxattr of xattr.txt', os.getxattr, m.p('xattr.txt'), 'user.note')
    t.check_bytes(t.read_file(m.p('xattr.txt')), FILES['xattr.txt'], f'{subvolume}/xattr.txt content')
    expect_eio(f'{subvolume}: listing of a directory with a damaged entry', os.listdir, m.p('listing'))
    expect_eio(f'{subvolume}: lookup of the damaged entry', os.stat, m.p('listing', 'entry-2'))
    for name in ENTRIES:
        if name != 'entry-2':
            t.check_bytes(t.read_file(m.p('listing', name)), name.encode(), f'{subvolume}/listing/{name}')
    for name in ('intact.bin', 'intact.txt'):
        t.check_bytes(t.read_file(m.p(name)), FILES[name], f'{subvolume}/{name}')
    t.check_equal(os.getxattr(m.p('intact.txt'), 'user.note'), b'another note', f'{subvolume}: intact xattr')


def check_scrub(store, subvolumes):
    r = store.run('scrub', expect=1)
    report = r.output
    print(report, flush=True)
    for name in ('attrs.bin', 'extent.bin', 'xattr.txt', 'listing'):
        t.check_equal(report.count(f'/{name}\n'), len(subvolumes), f'times scrub names the damaged /{name}')
    for name in ('intact.bin', 'intact.txt', 'entry-'):
        t.check_equal(report.count(name), 0, f'times scrub names the intact {name}')
    t.check('block reference count checksum mismatch' in report, 'scrub reports the damaged block count')
    summary = store.run('scrub', expect=1, json_output=True).json()
    # Each damaged record once, though every subvolume uses it.
    t.check_equal(summary['summary']['rows_damaged'], 5, 'damaged records counted')


def test_damaged_records():
    with t.Store('damage-records') as store:
        store.create('main')
        with store.mount('main') as m:
            populate(m)
        store.snapshot('main', 'copy', readonly=True)
        store.run('scrub')
        store.fsck()

        damage_records(store, store.show('copy')['top_layer'])
        for subvolume in ('main', 'copy'):
            with store.mount(subvolume, readonly=subvolume == 'copy') as m:
                check_reads(m, subvolume)
        check_scrub(store, ('main', 'copy'))
        r = store.fsck(expect=1)
        t.check('records fail their checksum' in r.output, f'fsck reports damaged records:\n{r.output}')
        t.check(store.usage()['corruption_events'] >= 5, 'corruption events counted')

        # With copy gone, the damaged layer has one child left: the reaper
        # would fold the two, but must not give the damage valid checks, and
        # must keep every block still in use.
        store.delete('copy')
        store.reap()
        with store.mount('main') as m:
            check_reads(m, 'main after the reap')
        check_scrub(store, ('main',))


def remove_inode_row(store, layer, name):
    db = layer_db(store, layer)
    ino = ino_of(db, 1, name)
    t.check_equal(db.execute('DELETE FROM inodes WHERE ino = ?', (ino,)).rowcount, 1, f'inode rows of {name} removed')
    db.commit()
    db.close()


def test_missing_inodes():
    """fsck walks the entries of a stack of layers once, however many
    subvolumes share it, and still names an entry whose inode is missing in
    every subvolume that sees it."""
    with t.Store('records-missing') as store:
        store.create('main')
        with store.mount('main') as m:
            for name in ('keep', 'gone'):
                t.write_file(m.p(name), name.encode(), fsync=True)
            t.fsync_dir(m.p(''))
        bottom = store.show('main')['top_layer']
        store.snapshot('main', 'twin')          # the same layers as main
        store.snapshot('main', 'work')
        with store.mount('work') as m:
            t.write_file(m.p('new'), b'new', fsync=True)
            t.fsync_dir(m.p(''))
        store.fsck()

        # Only the layer of 'work' that no other subvolume has.
        remove_inode_row(store, store.show('work')['top_layer'], 'new')
        r = store.fsck(expect=1)
        t.check_equal(r.output.count("entry 'new' names inode"), 1, f'reports of the missing inode:\n{r.output}')
        t.check("subvolume 'work': entry 'new'" in r.output, f'fsck names the subvolume:\n{r.output}')

        # The layer all three share: each one is reported.
        remove_inode_row(store, bottom, 'gone')
        r = store.fsck(expect=1)
        for subvolume in ('main', 'twin', 'work'):
            t.check(f"subvolume '{subvolume}': entry 'gone' names inode" in r.output,
                    f'fsck names the missing inode of gone in {subvolume}:\n{r.output}')
        t.check("entry 'keep'" not in r.output, f'fsck reports an intact entry:\n{r.output}')


def row_check(*values):
    """The store's record checksum (cowbox_check() of its layers): XXH3-64
    over each value as a type tag and its bytes."""
    data = b''
    for v in values:
        if isinstance(v, int):
            data += b'i' + struct.pack('<q', v)
        else:
            v = v.encode() if isinstance(v, str) else v
            data += b'b' + struct.pack('<I', len(v)) + v
    lib = ctypes.CDLL(ctypes.util.find_library('xxhash'))
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
    return struct.unpack('<q', struct.pack('<Q', lib.XXH3_64bits(data, len(data))))[0]


def add_entry(store, layer, parent, name, ino, kind):
    """A directory entry with a valid checksum, as a bug would write it."""
    db = layer_db(store, layer)
    db.execute('INSERT INTO dentries(parent, name, ino, type, row_check) VALUES (?, ?, ?, ?, ?)',
               (parent, name.encode(), ino, kind, row_check('dentry', parent, name.encode(), ino, kind)))
    db.commit()
    db.close()


def test_directory_loop():
    """A directory entry that names a directory above it: fsck of a stack
    of many layers ends, counts each inode once, names the directory, and
    reports nothing else; a checksum that does not match is found too."""
    with t.Store('records-loop') as store:
        store.create('main')
        with store.mount('main') as m:
            os.makedirs(m.p('a', 'b'))
            t.write_file(m.p('a', 'b', 'f'), b'f', fsync=True)
        for i in range(30):       # a live subvolume, snapshotted: a deep stack
            store.snapshot('main', f's{i}', readonly=True)
            with store.mount('main') as m:
                t.write_file(m.p('a', f'n{i}'), b'n', fsync=True)
                if i % 3 == 0:
                    os.unlink(m.p('a', f'n{i}'))
        store.fsck()
        t.check(store.show('main')['depth'] > 30, f"main's stack: {store.show('main')}")
        top = store.show('main')['top_layer']
        with store.mount('main', readonly=True) as m:
            a, b = os.lstat(m.p('a')).st_ino, os.lstat(m.p('a', 'b')).st_ino
        add_entry(store, top, b, 'up', a, 4)     # DT_DIR
        r = store.fsck(expect=1)
        t.check(f"subvolume 'main': directory inode {a} has more than one name" in r.output,
                f'fsck reports the loop:\n{r.output}')
        t.check_equal(r.output.count('subvolume '), 1, f'problems reported:\n{r.output}')

        db = layer_db(store, top)
        db.execute("UPDATE dentries SET row_check = row_check + 1 WHERE name = ?", (b'up',))
        db.commit()
        db.close()
        r = store.fsck(expect=1)
        t.check(f"directory inode {a} has more than one name" in r.output, f'fsck of the damaged loop:\n{r.output}')


def drop_row_checks(store, layer):
    """As a layer of a version before row checks and the orphans index."""
    db = layer_db(store, layer)
    db.execute('DROP INDEX orphans')
    for table in TABLES:
        db.execute(f'ALTER TABLE {table} DROP COLUMN row_check')
    db.commit()
    db.close()


def orphans_indexed(store, layer):
    """Whether the search for inodes without a name, done at every writable
    open, uses an index instead of reading every inode."""
    db = layer_db(store, layer)
    plan = ' '.join(str(row[-1]) for row in db.execute('EXPLAIN QUERY PLAN SELECT ino FROM inodes WHERE nlink = 0'))
    db.close()
    return 'USING INDEX orphans' in plan or 'USING COVERING INDEX orphans' in plan


def has_row_checks(store, layer):
    db = layer_db(store, layer)
    columns = [row[1] for row in db.execute('PRAGMA table_info(inodes)')]
    db.close()
    return 'row_check' in columns


def check_files(m, what, extra=()):
    for name, content in sorted(FILES.items()):
        t.check_bytes(t.read_file(m.p(name)), content, f'{what}: {name}')
    t.check_equal(os.getxattr(m.p('xattr.txt'), 'user.note'), b'a note', f'{what}: xattr')
    t.check_equal(sorted(os.listdir(m.p('listing'))), sorted(ENTRIES + list(extra)), f'{what}: listing')


def test_layers_without_checks():
    with t.Store('records-legacy') as store:
        store.create('old')
        with store.mount('old') as m:
            populate(m)
        layer = store.show('old')['top_layer']
        t.check(orphans_indexed(store, layer), 'a new layer has no index of its orphans')
        drop_row_checks(store, layer)

        # Read as it is, frozen under a snapshot.
        store.snapshot('old', 'frozen', readonly=True)
        with store.mount('frozen', readonly=True) as m:
            check_files(m, 'frozen layer without checks')
        t.check(not has_row_checks(store, layer), 'a frozen layer was changed')
        store.run('scrub')

        # A writable top layer without checks gets them when opened.
        store.create('live')
        with store.mount('live') as m:
            populate(m)
        live_layer = store.show('live')['top_layer']
        drop_row_checks(store, live_layer)
        with store.mount('live') as m:
            check_files(m, 'writable layer without checks')
            t.write_file(m.p('listing', 'new'), b'new', fsync=True)
            t.fsync_dir(m.p('listing'))
        t.check(has_row_checks(store, live_layer), 'the writable layer got no checks')
        t.check(orphans_indexed(store, live_layer), 'the writable layer got no index of its orphans')
        with store.mount('live', readonly=True) as m:
            check_files(m, 'layer given checks', extra=['new'])
        store.run('scrub')
        store.fsck()


def test_lost_layer():
    """A layer's database gone (deleted by mistake, or lost with a disk's
    sector) is no empty layer: the subvolumes that use it refuse to mount
    instead of showing what is left, scrub and fsck name it and each of
    them, fsck --repair does not take the loss for the truth, and the
    reaper frees none of the blocks it named, so that once the database is
    back every file reads as before. The other subvolumes are untouched."""
    with t.Store('records-lost-layer') as store:
        store.create('main')
        contents = {f'f{i}': t.random_bytes(300 * KiB, 60 + i) for i in range(3)}
        with store.mount('main') as m:
            for name, data in contents.items():
                t.write_file(m.p(name), data, fsync=True)
            t.write_file(m.p('small'), b'small', fsync=True)
            t.fsync_dir(m.p(''))
        bottom = store.show('main')['top_layer']
        store.snapshot('main', 'snap', readonly=True)
        with store.mount('main') as m:
            t.write_file(m.p('later'), b'later', fsync=True)
            t.fsync_dir(m.p(''))
        store.create('other')
        with store.mount('other') as m:
            t.write_file(m.p('mine'), b'mine', fsync=True)
            t.fsync_dir(m.p(''))
        store.fsck()
        # A store made before layers said whether their database was made
        # (and before the catalog's records had checks): those whose
        # database is there were.
        catalog = sqlite3.connect(J(store.path, 'catalog.db'))
        for (trigger,) in catalog.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            catalog.execute(f'DROP TRIGGER {trigger}')
        for table in ('subvolumes', 'layers', 'meta', 'counters', 'packs'):
            catalog.execute(f'ALTER TABLE {table} DROP COLUMN row_check')
        catalog.execute('ALTER TABLE layers DROP COLUMN made')
        catalog.commit()
        catalog.close()
        store.names()
        r = store.fsck()
        t.check('checksum' not in r.output, f'fsck after the catalog was given its checks:\n{r.output}')
        catalog = sqlite3.connect(J(store.path, 'catalog.db'))
        made = dict(catalog.execute('SELECT id, made FROM layers'))
        catalog.close()
        t.check_equal(made[bottom], 1, f'the bottom layer after the catalog was upgraded: {made}')
        for layer, flag in made.items():
            t.check_equal(flag, int(os.path.exists(J(store.path, 'layers', f'{layer}.db'))),
                          f'layer {layer} made, after the catalog was upgraded')

        path = J(store.path, 'layers', f'{bottom}.db')
        os.rename(path, path + '.away')
        for name in ('main', 'snap'):
            r = store.run('mount', '--background', name, store.new_dir(f'mnt-{name}'), expect=1)
            t.check('damaged' in r.err, f'mounting {name} without its bottom layer:\n{r.err}')
        t.check_equal(sorted(store.names()), ['main', 'other', 'snap'], 'subvolumes listed with a layer lost')
        r = store.run('scrub', expect=1)
        t.check('layer database missing' in r.output and "main" in r.output and 'snap' in r.output
                and 'other' not in r.output, f'scrub of a store with a layer lost:\n{r.output}')
        for repair in (False, True):
            r = store.fsck(repair=repair, expect=1)
            t.check(f'layer {bottom}: its database is missing' in r.output
                    and f"subvolume 'main': layer {bottom} of its stack is lost" in r.output
                    and f"subvolume 'snap': layer {bottom} of its stack is lost" in r.output
                    and "'other'" not in r.output, f'fsck (repair: {repair}) of a store with a layer lost:\n{r.output}')
        store.run('reap', '--wait', expect=1)
        with store.mount('other') as m:
            t.check_equal(t.read_file(m.p('mine')), b'mine', 'a subvolume that does not use the lost layer')

        os.rename(path + '.away', path)
        with store.mount('main') as m:
            for name, data in contents.items():
                t.check_bytes(t.read_file(m.p(name)), data, f'main/{name} once its layer is back')
            t.check_equal(t.read_file(m.p('later')), b'later', 'main/later once its layer is back')
        store.run('scrub')
        store.fsck()

        # The same for a database whose header is damaged: named, and the
        # rest of the store is checked and listed.
        with open(path, 'rb') as f:
            good = f.read()
        with open(path, 'r+b') as f:
            f.write(bytes(100))
        r = store.run('scrub', expect=1)
        t.check(r.output.count('layer database unreadable') == 2 and 'other' not in r.output,
                f'scrub of a store with a layer whose header is damaged:\n{r.output}')
        r = store.fsck(expect=1)
        t.check(f'layer {bottom}: its database cannot be read' in r.output
                and f"subvolume 'snap': layer {bottom} of its stack is lost" in r.output,
                f'fsck of a store with a layer whose header is damaged:\n{r.output}')
        t.check_equal(sorted(store.names()), ['main', 'other', 'snap'], 'subvolumes listed with a layer damaged')
        store.run('reap', '--wait', expect=1)
        with open(path, 'wb') as f:
            f.write(good)
        store.fsck()


def test_catalog_top_layers():
    """A catalog whose records agree with their checks but not with each
    other, as a bug could write them: a subvolume whose top layer is
    another's is caught by what fsck knows of writable subvolumes' tops."""
    with t.Store('records-catalog') as store:
        for name in ('a', 'b'):
            store.create(name)
            with store.mount(name) as m:
                t.write_file(m.p('who'), name.encode(), fsync=True)
        store.snapshot('b', 'b-snap', readonly=True)
        store.fsck()
        catalog = t.open_catalog(store.path)
        top_b = store.show('b')['top_layer']
        frozen_b = catalog.execute('SELECT parent FROM layers WHERE id = ?', (top_b,)).fetchone()[0]
        for target, words in ((top_b, "subvolumes a, b share top layer"),
                              (frozen_b, "writable subvolume 'a' has top layer")):
            catalog.execute("UPDATE subvolumes SET top_layer = ? WHERE name = 'a'", (target,))
            catalog.commit()
            r = store.fsck(expect=1)
            t.check(words in r.output, f'fsck of a catalog whose top layer of a is {target}:\n{r.output}')
        catalog.close()


def stored_files(store):
    """The store's layer and pack files with their sizes."""
    return {f'{d}/{n}': os.path.getsize(J(store.path, d, n))
            for d in ('layers', 'packs') for n in os.listdir(J(store.path, d))}


def change_behind_the_back(catalog, table, row_id, assignment, *params):
    """Changes a record of the catalog as damage would: its check stays."""
    (check,) = catalog.execute(f'SELECT row_check FROM {table} WHERE id = ?', (row_id,)).fetchone()
    catalog.execute(f'UPDATE {table} SET {assignment} WHERE id = ?', (*params, row_id))
    catalog.execute(f'UPDATE {table} SET row_check = ? WHERE id = ?', (check, row_id))
    catalog.commit()


def check_listed_damaged(store, sound, damaged, what):
    """A listing with one damaged subvolume lists the others as they are,
    names the damaged one, and fails; usage counts it and fails likewise."""
    r = store.run('subvolume', 'list', expect=1)
    t.check(f"subvolume '{damaged}'" in r.err and 'damaged' in r.err and 'delet' in r.err,
            f'subvolume list with {what}:\n{r.describe()}')
    listed = re.findall(r'^ *\d+ +(\S+) ', r.out, re.M)
    t.check_equal(listed, sound, f'subvolumes listed in text with {what}')

    r = store.run('subvolume', 'list', json_output=True, expect=1)
    doc = r.json()
    t.check_equal(sorted(s['name'] for s in t.json_subvolume_list(doc)), sound,
                  f'subvolumes listed in JSON with {what}')
    t.check_equal([s['name'] for s in doc['damaged']], [damaged], f'damaged subvolumes in JSON with {what}')
    t.check_equal(doc['damaged'][0]['id'], store_id(store, damaged), f'ID of the damaged subvolume ({what})')
    for s in t.json_subvolume_list(doc):
        t.check(s['inodes'] > 0, f'{s["name"]} listed without its figures, with {what}: {s}')

    r = store.run('usage', json_output=True, expect=1)
    doc = r.json()
    t.json_usage(doc)
    t.check_equal(doc['total']['damaged_subvolumes'], 1, f'damaged subvolumes in usage with {what}')
    t.check_equal(doc['total']['subvolumes'], len(sound) + 1, f'subvolumes in usage with {what}')
    t.check_equal(sorted(s['name'] for s in doc['subvolumes']), sound, f'rows of usage with {what}')
    t.check(f"subvolume '{damaged}'" in r.err, f'usage with {what}:\n{r.describe()}')


def store_id(store, name):
    """The ID of a subvolume whatever the state of its record: the catalog's."""
    catalog = t.open_catalog(store.path)
    try:
        (sid,) = catalog.execute('SELECT id FROM subvolumes WHERE name = ? AND deleted = 0', (name,)).fetchone()
    finally:
        catalog.close()
    return sid


def test_catalog_record_checks():
    """The catalog's records of subvolumes and layers carry checks. A record
    changed behind the store's back (a top layer that names another's, as a
    flipped bit would) is not used: its subvolume neither shows nor mounts,
    a change of it leaves it damaged, the reaper frees nothing while a live
    subvolume has one, and scrub and fsck name it. Deleting the subvolume
    mends the store: the reaper then frees what only it held."""
    with t.Store('records-catalog-checks') as store:
        content = {name: t.random_bytes(300 * 1024, i) for i, name in enumerate(('a', 'b', 'c', 'doomed'))}
        for name, data in content.items():
            store.create(name)
            with store.mount(name) as m:
                t.write_file(m.p('who'), data, fsync=True)
        store.delete('doomed', reap=False)
        top_b, top_c = store.show('b')['top_layer'], store.show('c')['top_layer']

        catalog = t.open_catalog(store.path)
        change_behind_the_back(catalog, 'subvolumes', store.show('a')['id'], 'top_layer = ?', top_b)
        for args in (['subvolume', 'set-quota', 'a', '1G'], ['subvolume', 'snapshot', 'a', 'a-snap']):
            r = store.run(*args, expect=None)
            t.check(r.code != 0 and 'damaged' in r.err, f'{" ".join(args)} of a damaged record:\n{r.describe()}')
        for args in (['subvolume', 'show', 'a'], ['mount', 'a', store.new_dir('mnt-a')]):
            r = store.run(*args, expect=None)
            t.check(r.code != 0 and 'damaged' in r.err, f'{" ".join(args)} with a damaged record of a:\n{r.describe()}')
        check_listed_damaged(store, ['b', 'c'], 'a', 'a damaged record of a')
        kept = stored_files(store)
        r = store.run('reap', '--wait', expect=None)
        t.check(r.code != 0, f'reap with a damaged record in the catalog:\n{r.describe()}')
        t.check_equal(stored_files(store), kept, 'layer and pack files after the refused reap')
        with store.mount('b', readonly=True) as m:
            t.check_bytes(t.read_file(m.p('who')), content['b'], "b's file beside a's damaged record")
        r = store.run('scrub', expect=1)
        t.check(re.search(r'Subvolume: +a\n.*\n +Problem: +damaged catalog record of a subvolume\n', r.out)
                and 'catalog subvolume' in r.out, f'scrub with a damaged record of a:\n{r.describe()}')
        r = store.fsck(expect=1)
        t.check("('a') fails its checksum" in r.output, f'fsck with a damaged record of a:\n{r.output}')

        store.run('subvolume', 'delete', 'a')
        store.reap()
        t.check_equal(store.names(), ['b', 'c'], 'subvolumes once a was deleted')
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'bytes waiting once a was deleted and reaped')
        store.fsck()
        store.run('scrub')

        # A layer's record: the subvolumes on it are not used until deleted.
        # A snapshot of a subvolume whose top was never written stands on
        # the layer below it, as its record says: not on a damaged one.
        store.snapshot('b', 'e')
        top_e = store.show('e')['top_layer']
        change_behind_the_back(catalog, 'layers', top_e, 'parent = ?', top_c)
        change_behind_the_back(catalog, 'layers', top_c, 'created_usec = created_usec + 1')
        catalog.close()
        r = store.run('subvolume', 'snapshot', '-r', 'e', 'e-snap', expect=None)
        t.check(r.code != 0 and 'damaged' in r.err, f'snapshot of e over a damaged top record:\n{r.describe()}')
        store.run('subvolume', 'delete', 'e')
        r = store.run('subvolume', 'show', 'c', expect=None)
        t.check(r.code != 0 and 'damaged' in r.err, f'show of c over a damaged layer record:\n{r.describe()}')
        check_listed_damaged(store, ['b'], 'c', f'a damaged record of layer {top_c}')
        r = store.run('scrub', expect=1)
        t.check(f'catalog layer {top_c}' in r.out, f'scrub with a damaged record of layer {top_c}:\n{r.describe()}')
        # A damaged row of b's layer is named with the files of every stack
        # that uses it; c's, which cannot be read for the damaged record,
        # is passed by, not the end of the scrub.
        catalog = t.open_catalog(store.path)
        layer = store.show('b')['top_layer']
        while not os.path.exists(J(store.path, 'layers', f'{layer}.db')):     # a top never written
            (layer,) = catalog.execute('SELECT parent FROM layers WHERE id = ?', (layer,)).fetchone()
        catalog.close()
        db = layer_db(store, layer)
        who = ino_of(db, 1, 'who')
        db.execute('UPDATE inodes SET uid = uid + 1 WHERE ino = ?', (who,))
        db.commit()
        r = store.run('scrub', expect=1)
        t.check(re.search(r'Subvolume: +b\n +Path: +/who\n', r.out) and f'catalog layer {top_c}' in r.out
                and re.search(r'Damaged files: +1\n', r.out),
                f'scrub with a damaged row of b beside the damaged record of layer {top_c}:\n{r.describe()}')
        db.execute('UPDATE inodes SET uid = uid - 1 WHERE ino = ?', (who,))
        db.commit()
        db.close()
        r = store.run('reap', '--wait', expect=None)
        t.check(r.code != 0, f'reap with a damaged record of a live layer:\n{r.describe()}')
        store.run('subvolume', 'delete', 'c')
        store.reap()
        t.check_equal(store.names(), ['b'], 'subvolumes once c was deleted')
        with store.mount('b', readonly=True) as m:
            t.check_bytes(t.read_file(m.p('who')), content['b'], "b's file at the end")
        store.fsck()
        store.run('scrub')


def test_damaged_name():
    """A damaged record whose name is no longer a valid one (a flipped bit
    made a '/' of it) is named by its ID, and deleted by its ID: delete
    --id mends the store, and the reaper then frees what it held; so it
    does for a damaged record of a deleted subvolume, which scrub names
    and which keeps the reaper from freeing anything. --id deletes a sound
    subvolume too, refuses one mounted writable, and says so when no
    subvolume has the ID (a deleted one's either)."""
    with t.Store('records-damaged-name') as store:
        for i, name in enumerate(('a', 'b', 'c', 'd', 'e')):
            store.create(name)
            with store.mount(name) as m:
                t.write_file(m.p('f'), t.random_bytes(100 * KiB, i), fsync=True)
        id_a, id_b, id_c, id_d, id_e = (store.show(n)['id'] for n in ('a', 'b', 'c', 'd', 'e'))
        store.delete('d', reap=False)
        store.delete('e', reap=False)
        catalog = t.open_catalog(store.path)
        change_behind_the_back(catalog, 'subvolumes', id_a, "name = 'a/../b'")
        change_behind_the_back(catalog, 'subvolumes', id_d, 'quota_bytes = 5')
        catalog.close()

        r = store.run('subvolume', 'list', json_output=True, expect=1)
        t.check_equal(r.json()['damaged'], [{'id': id_a, 'name': 'a/../b'}], 'the damaged record listed')
        r = store.run('subvolume', 'list', expect=1)
        t.check(f'delete --id {id_a}' in r.err, f'the listing tells how to delete it:\n{r.describe()}')
        r = store.run('subvolume', 'delete', 'a/../b', expect=2)
        t.check('not a valid subvolume name' in r.err, f'delete by the damaged name:\n{r.describe()}')

        for bad in ('x', '0', '1x', '', str(2**63), str(2**64), str(id_e), str(id_e + 100)):
            r = store.run('subvolume', 'delete', '--id', bad, expect=1)
            known = bad.isdigit() and 0 < int(bad) < 2**63
            t.check(('no subvolume has ID' if known else 'not a subvolume ID') in r.err,
                    f'delete --id {bad!r}:\n{r.describe()}')
        r = store.run('subvolume', 'delete', '--id', str(id_a), 'a', expect=2)
        t.check('unexpected argument' in r.err, f'delete --id with a name too:\n{r.describe()}')
        with store.mount('b'):
            r = store.run('subvolume', 'delete', '--id', str(id_b), expect=1)
            t.check(f'subvolume ID {id_b} is mounted by' in r.err, f'delete --id of a mounted one:\n{r.describe()}')

        r = store.run('scrub', expect=1)
        t.check(f'catalog subvolume {id_d}' in r.out, f'scrub with a damaged record of a deleted one:\n{r.describe()}')
        r = store.run('subvolume', 'delete', '--id', str(id_d), '--no-reap')
        t.check(f'Deleted subvolume ID {id_d}' in r.out, f'delete --id of a deleted one\'s damaged record:\n'
                f'{r.describe()}')
        kept = stored_files(store)
        doc = store.json('subvolume', 'delete', '--id', str(id_a), '--no-reap')
        t.check_equal(doc, {'id': id_a, 'reaper_started': False}, 'delete --id of the damaged record in JSON')
        t.check_equal(store.names(), ['b', 'c'], 'subvolumes once the damaged one was deleted by ID')
        store.reap()
        t.check(len(stored_files(store)) < len(kept), 'the reaper freed the layer of the damaged record')

        r = store.run('subvolume', 'delete', '--id', str(id_c))
        t.check(f'Deleted subvolume ID {id_c}' in r.out, f'delete --id of a sound subvolume:\n{r.describe()}')
        t.check_equal(store.names(), ['b'], 'subvolumes once c was deleted by ID')
        store.reap()
        with store.mount('b', readonly=True) as m:
            t.check_bytes(t.read_file(m.p('f')), t.random_bytes(100 * KiB, 1), "b's file at the end")
        store.fsck()
        store.run('scrub')


def test_broken_stack_beside_damaged_record():
    """A stack that cannot be read is passed by in scrub only when a damaged
    record of one of its own layers explains it, which scrub names. One
    broken otherwise (a layer's row gone from the catalog), beside the
    damaged record of another's layer, stops the scrub, which says to run
    fsck: it is not passed by as if explained."""
    with t.Store('records-broken-stack') as store:
        for name in ('a', 'b', 'g'):
            store.create(name)
            with store.mount(name) as m:
                t.write_file(m.p('who'), name.encode(), fsync=True)
            store.snapshot(name, f'{name}-snap', readonly=True)
        catalog = t.open_catalog(store.path)
        top_a = store.show('a')['top_layer']
        change_behind_the_back(catalog, 'layers', top_a, 'created_usec = created_usec + 1')
        db = layer_db(store, store.show('b-snap')['top_layer'])
        db.execute('UPDATE inodes SET uid = uid + 1 WHERE ino = ?', (ino_of(db, 1, 'who'),))
        db.commit()
        db.close()
        r = store.run('scrub', expect=1)
        t.check(f'catalog layer {top_a}' in r.out and re.search(r'Damaged files: +[12]\n', r.out),
                f'scrub with a damaged row of b beside the damaged record of a\'s layer:\n{r.describe()}')

        (below_g,) = catalog.execute('SELECT parent FROM layers WHERE id = ?', (store.show('g')['top_layer'],)).fetchone()
        catalog.execute('DELETE FROM layers WHERE id = ?', (below_g,))
        catalog.commit()
        catalog.close()
        r = store.run('scrub', expect=1)
        t.check('stopped' in r.err and 'fsck' in r.err,
                f'scrub with g\'s stack broken beside the damaged record of a\'s layer:\n{r.describe()}')


def change_keyed_behind_the_back(catalog, table, key, assignment):
    """change_behind_the_back() for the rows of meta and counters, by key."""
    (check,) = catalog.execute(f'SELECT row_check FROM {table} WHERE key = ?', (key,)).fetchone()
    catalog.execute(f'UPDATE {table} SET {assignment} WHERE key = ?', (key,))
    catalog.execute(f'UPDATE {table} SET row_check = ? WHERE key = ?', (check, key))
    catalog.commit()


def test_catalog_other_records():
    """The catalog's other records carry checks too: a setting, a counter
    and a pack file's record changed behind the store's back are not used.
    A damaged setting reads as its default until set again; a damaged
    transaction counter refuses snapshots; scrub names each and fails, and
    fsck --repair writes them anew from what the store knows. A damaged
    record of the store's identity keeps the store from opening."""
    with t.Store('records-catalog-other') as store:
        store.create('a')
        with store.mount('a') as m:
            t.write_file(m.p('f'), t.random_bytes(200 * 1024, 7), fsync=True)
        store.run('reap', '--rate', '5M')
        t.check_equal(store.json('reap', '--rate', '5M')['rate_bytes_per_sec'], 5 << 20, 'the rate set')
        (pack,) = [p for (p,) in t.open_catalog(store.path).execute('SELECT id FROM packs')][:1]

        catalog = t.open_catalog(store.path)
        change_keyed_behind_the_back(catalog, 'meta', 'reaper_rate', 'value = 6 * 1048576')
        change_keyed_behind_the_back(catalog, 'counters', 'transid', 'value = value + 40')
        change_behind_the_back(catalog, 'packs', pack, 'created_usec = created_usec + 1')
        catalog.close()

        settings = store.json('reap', '--resume')
        t.check_equal(settings['rate_bytes_per_sec'], 0, 'a damaged rate: the default, not the damaged value')
        r = store.run('subvolume', 'snapshot', '-r', 'a', 'a-snap', expect=None)
        t.check(r.code != 0 and 'damaged' in r.err, f'a snapshot with a damaged transaction counter:\n{r.describe()}')
        r = store.run('scrub', expect=1)
        for what in ('catalog setting reaper_rate', 'catalog counter transid', f'catalog pack {pack}'):
            t.check(what in r.out, f'scrub with damaged records names {what}:\n{r.describe()}')
        r = store.fsck(expect=1)
        t.check('setting reaper_rate fails its checksum' in r.output and 'counter transid' in r.output
                and f'pack {pack}' in r.output, f'fsck with damaged records:\n{r.output}')
        with store.mount('a', readonly=True) as m:
            t.check_bytes(t.read_file(m.p('f')), t.random_bytes(200 * 1024, 7), "a's file beside the damage")

        store.run('fsck', '--repair')
        store.fsck()
        store.run('scrub')
        store.snapshot('a', 'a-snap')
        transids = [row[0] for row in t.open_catalog(store.path).execute('SELECT ctransid FROM subvolumes')]
        t.check(len(set(transids)) == len(transids), f'transaction ids after the counter was mended: {transids}')
        t.check_equal(store.json('reap', '--resume')['rate_bytes_per_sec'], 0, 'the rate once mended')
        store.run('subvolume', 'delete', 'a')
        store.reap()
        store.fsck()

        catalog = t.open_catalog(store.path)
        change_keyed_behind_the_back(catalog, 'meta', 'uuid', "value = '00000000-0000-4000-8000-000000000000'")
        catalog.close()
        r = store.run('subvolume', 'list', expect=None)
        t.check(r.code != 0 and 'damaged' in r.err, f'a store whose UUID record is damaged:\n{r.describe()}')


def run():
    t.require_fuse()
    sub = t.Subtests()
    sub.run('damaged top layers in the catalog', test_catalog_top_layers)
    sub.run('checks of the records of the catalog', test_catalog_record_checks)
    sub.run('checks of the catalog\'s other records', test_catalog_other_records)
    sub.run('a damaged name, deleted by ID', test_damaged_name)
    sub.run('a broken stack beside a damaged record', test_broken_stack_beside_damaged_record)
    sub.run('a lost layer database', test_lost_layer)
    sub.run('damaged records', test_damaged_records)
    sub.run('layers without checks', test_layers_without_checks)
    sub.run('missing inodes', test_missing_inodes)
    sub.run('a directory loop', test_directory_loop)
    sub.check()


t.main(run)
