#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The store's compression dictionary. Once a few MiB of small files were
written, the store trains a zstd dictionary on them, keeps it in its
catalog, and compresses the small files written after that with it, also
in later processes: they take clearly less space than those compressed
alone, and read back exactly, also from another process. A damaged
dictionary is caught: the files that need it give EIO, the others still
read, new files are compressed alone, and scrub names the damaged ones."""

import errno
import os
import random
import sqlite3
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402

J = os.path.join
N_FILES = 1600
ZSTD_MAGIC = b'\x28\xb5\x2f\xfd'
WORDS = ('static', 'int', 'return', 'struct', 'const', 'char', 'size_t', 'if', 'for', 'while', 'uint64_t',
         'errno', 'NULL', 'free', 'goto', 'fail', 'bool', 'void', 'unsigned', 'sizeof', 'else')
IDENTS = ('volume', 'layer', 'inode', 'dentry', 'extent', 'block', 'digest', 'store', 'catalog', 'pack',
          'offset', 'length', 'buffer', 'count', 'parent', 'name', 'mode', 'flags', 'result', 'value')


def source_file(rng, size):
    """C-like text, different in every file, shaped like its neighbours."""
    lines = []
    total = 0
    while total < size:
        ident = f'{rng.choice(IDENTS)}_{rng.choice(IDENTS)}'
        kind = rng.randrange(4)
        if kind == 0:
            line = f'static int {ident}({rng.choice(WORDS)} *{rng.choice(IDENTS)}, size_t n) {{'
        elif kind == 1:
            line = f'        if ({ident} < 0)\n                return {rng.choice(("r", "-EIO", "-ENOMEM"))};'
        elif kind == 2:
            line = f'        {rng.choice(IDENTS)}->{ident} = {rng.randrange(1 << 20)};'
        else:
            line = f'/* {" ".join(rng.choice(IDENTS + WORDS) for _ in range(rng.randrange(3, 12)))} */'
        lines.append(line)
        total += len(line) + 1
    return ('\n'.join(lines) + '\n').encode()[:size]


def frame_dict_id(frame):
    """The dictionary ID a zstd frame names (0 for none)."""
    if not frame.startswith(ZSTD_MAGIC):
        return None
    descriptor = frame[4]
    single_segment = descriptor & 0x20
    width = (0, 1, 2, 4)[descriptor & 3]
    start = 5 + (0 if single_segment else 1)
    return int.from_bytes(frame[start:start + width], 'little') if width else 0


def inline_rows(store, layer):
    """(name, stored bytes, dictionary ID) of each small file in the root."""
    db = sqlite3.connect(f"file:{J(store.path, 'layers', f'{layer}.db')}?mode=ro", uri=True)
    rows = db.execute('SELECT d.name, i.data, i.data_zstd FROM dentries d JOIN inodes i ON i.ino = d.ino '
                      'WHERE d.parent = 1 AND i.data IS NOT NULL').fetchall()
    db.close()
    return [(name.decode(), data, frame_dict_id(data) if zstd else None) for name, data, zstd in rows]


def run():
    t.require_fuse()
    rng = random.Random(7)
    files = {f'f{i:04}.c': source_file(rng, rng.randrange(1500, 4000)) for i in range(N_FILES)}
    with t.Store('dictionary') as store:
        store.create('main')
        with store.mount('main') as m:
            for name, content in files.items():
                t.write_file(m.p(name), content)
            t.fsync_dir(m.p(''))

        catalog = sqlite3.connect(f"file:{J(store.path, 'catalog.db')}?mode=ro", uri=True)
        dicts = catalog.execute('SELECT dict_id, length(content) FROM dictionaries').fetchall()
        catalog.close()
        t.check_equal(len(dicts), 1, 'dictionaries in the catalog')
        dict_id = dicts[0][0]

        rows = inline_rows(store, store.show('main')['top_layer'])
        t.check_equal(len(rows), N_FILES, 'small files stored inline')
        with_dict = [(name, data) for name, data, d in rows if d == dict_id]
        alone = [(name, data) for name, data, d in rows if d == 0]
        print(f'{len(with_dict)} files compressed with dictionary {dict_id}, {len(alone)} alone', flush=True)
        t.check(len(with_dict) >= N_FILES // 3, f'only {len(with_dict)} files use the dictionary')
        t.check(len(alone) > 0, 'no file was written before the dictionary: nothing to compare with')

        def ratio(group):
            return sum(len(data) for _, data in group) / sum(len(files[name]) for name, _ in group)
        print(f'stored/logical: {ratio(with_dict):.3f} with the dictionary, {ratio(alone):.3f} alone', flush=True)
        t.check(ratio(with_dict) < 0.85 * ratio(alone),
                f'the dictionary saves too little: {ratio(with_dict):.3f} against {ratio(alone):.3f}')

        # Another process reads them back, and compresses new small files
        # with the dictionary it reads from the catalog.
        later = {f'later{i:03}.c': source_file(rng, rng.randrange(1500, 4000)) for i in range(40)}
        with store.mount('main') as m:
            for name, content in files.items():
                t.check_bytes(t.read_file(m.p(name)), content, name)
            for name, content in later.items():
                t.write_file(m.p(name), content)
            t.fsync_dir(m.p(''))
        later_ids = {d for name, _, d in inline_rows(store, store.show('main')['top_layer']) if name in later}
        t.check_equal(later_ids, {dict_id}, 'dictionaries named by files written by the next mount')
        with store.mount('main', readonly=True) as m:
            for name, content in later.items():
                t.check_bytes(t.read_file(m.p(name)), content, name)
        store.run('scrub')

        # A damaged dictionary: its files give EIO, the others read.
        db = sqlite3.connect(J(store.path, 'catalog.db'))
        content = bytearray(db.execute('SELECT content FROM dictionaries').fetchone()[0])
        content[len(content) // 2] ^= 0x01
        db.execute('UPDATE dictionaries SET content = ?', (bytes(content),))
        db.commit()
        db.close()
        # New small files are compressed alone then, and read back.
        fresh = {f'fresh{i:03}.c': source_file(rng, rng.randrange(1500, 4000)) for i in range(40)}
        with store.mount('main') as m:
            for name, _ in with_dict[:20]:
                t.expect_errno(errno.EIO, t.read_file, m.p(name), what=f'read of {name} (damaged dictionary)')
            for name, _ in alone[:20]:
                t.check_bytes(t.read_file(m.p(name)), files[name], f'{name}, compressed alone')
            for name, content in fresh.items():
                t.write_file(m.p(name), content)
            t.fsync_dir(m.p(''))
        fresh_ids = {d for name, _, d in inline_rows(store, store.show('main')['top_layer']) if name in fresh}
        t.check_equal(fresh_ids, {0}, 'dictionaries named by files written after the damage')
        with store.mount('main', readonly=True) as m:
            for name, content in fresh.items():
                t.check_bytes(t.read_file(m.p(name)), content, f'{name}, written after the damage')
        r = store.run('scrub', expect=1)
        for name, _ in with_dict[:20]:
            t.check(f'/{name}\n' in r.output, f'scrub does not name {name}')
        for name, _ in alone[:20]:
            t.check(f'/{name}\n' not in r.output, f'scrub names {name}, which is intact')


t.main(run)
