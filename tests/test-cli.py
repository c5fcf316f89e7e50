#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""cowbox-store as an administrator meets it: init, subvolume create, list,
show, snapshot, delete, --json, --help, and a clear error with a non-zero
exit status for every misuse. No FUSE needed."""

import fcntl
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402

UUID_RE = re.compile(r'^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')


def check_mentions(result, needle, what):
    t.check(needle.lower() in result.err.lower(),
            f'{what}: the message does not mention {needle!r}:\n{result.describe()}')


def test_init(store):
    t.check(os.path.isdir(store.path), f'init did not create {store.path}')
    t.check_equal(store.list(), [], 'subvolumes of a new store')
    r = store.run('init', expect='fail')
    t.check(any(w in r.err.lower() for w in ('exist', 'already')),
            f'init of an existing store should say it already exists:\n{r.describe()}')
    t.check_equal(store.list(), [], 'subvolumes after a second init')


def test_init_non_empty_dir(store):
    d = store.new_dir('not-empty')
    t.write_file(os.path.join(d, 'precious'), b'data')
    t.run_command([t.tool(), '--store', d, 'init'], expect='fail')
    t.check_equal(t.read_file(os.path.join(d, 'precious')), b'data', 'a file in a directory init refused')


def test_missing_store(store):
    missing = os.path.join(store.tmp, 'no-store-here')
    for args in (['subvolume', 'list'], ['subvolume', 'create', 'x'], ['usage']):
        r = t.run_command([t.tool(), '--store', missing] + args, expect='fail')
        check_mentions(r, 'init', f'{" ".join(args)} on a missing store (should say how to create one)')
    t.check(not os.path.exists(missing), f'using a missing store created {missing}')

    # A store on a read-only file system is there, not missing.
    if os.geteuid() != 0:
        print('SKIP: a store on a read-only file system: a bind mount needs root', flush=True)
        return
    ro = store.new_dir('read-only')
    subprocess.run(['mount', '--bind', '-o', 'ro', store.tmp, ro], check=True)
    try:
        r = t.run_command([t.tool(), '--store', os.path.join(ro, 'store'), 'subvolume', 'list'], expect='fail')
        t.check('read-only file system' in r.err and 'init' not in r.err,
                f'a store on a read-only file system:\n{r.err}')
    finally:
        subprocess.run(['umount', ro], check=True)


def test_store_from_environment(store):
    r = t.run_command([t.tool(), '--json', 'subvolume', 'list'], env={'COWBOX_STORE': store.path})
    t.json_subvolume_list(r.json())
    missing = os.path.join(store.tmp, 'env-missing')
    t.run_command([t.tool(), 'subvolume', 'list'], env={'COWBOX_STORE': missing}, expect='fail')


def test_create_list_show_delete(store):
    for name in ('alpha', 'beta', 'name with spaces', 'ünïcode-ñame', 'x' * 255):
        store.create(name)
    subvols = {s['name']: s for s in store.list()}
    t.check_equal(sorted(subvols), sorted(['alpha', 'beta', 'name with spaces', 'ünïcode-ñame', 'x' * 255]),
                  'subvolume names listed')
    uuids = [s['uuid'] for s in subvols.values()]
    t.check(all(UUID_RE.match(u) for u in uuids), f'uuids are not canonical: {uuids}')
    t.check_equal(len(set(uuids)), len(uuids), 'distinct uuids')
    for s in subvols.values():
        t.check_equal(s['readonly'], False, f'{s["name"]}: readonly')
        t.check_equal(s['parent_uuid'], '', f'{s["name"]}: parent_uuid')
        t.check_equal(s['mounted_by'], 0, f'{s["name"]}: mounted_by')
        t.check_equal(s['logical_bytes'], 0, f'{s["name"]}: logical bytes of an empty subvolume')
    alpha = store.show('alpha')
    t.check_equal(alpha['uuid'], subvols['alpha']['uuid'], 'uuid in show and list')

    text = store.run('subvolume', 'list').out
    for name in ('alpha', 'beta', 'name with spaces'):
        t.check(name in text, f'subvolume list does not print {name!r}:\n{text}')
    text = store.run('subvolume', 'show', 'alpha').out
    t.check('alpha' in text and alpha['uuid'] in text, f'subvolume show prints no name or uuid:\n{text}')

    store.delete('beta')
    t.check('beta' not in store.names(), 'beta still listed after delete')
    r = store.run('subvolume', 'show', 'beta', expect='fail')
    check_mentions(r, 'beta', 'show of a deleted subvolume')
    r = store.run('subvolume', 'delete', 'beta', expect='fail')
    check_mentions(r, 'beta', 'second delete')
    store.delete('name with spaces', reap=False)
    store.reap()
    t.check_equal(store.names(), sorted(['alpha', 'ünïcode-ñame', 'x' * 255]), 'names after deletes and reap')

    # A deleted name can be used again, for a new subvolume.
    store.create('beta')
    t.check(store.show('beta')['uuid'] not in uuids, 'a re-created subvolume got an old uuid')


def test_invalid_names(store):
    before = store.names()
    for name in ('', '.', '..', 'a/b', '/abs', 'x' * 256, 'new\nline', 'tab\there'):
        r = store.run('subvolume', 'create', name, expect='fail')
        t.check(r.err.strip(), f'create {name!r}: no message')
        store.run('subvolume', 'snapshot', 'alpha', name, expect='fail')
    t.check_equal(store.names(), before, 'subvolumes after invalid names were refused')


def test_snapshots(store):
    store.create('origin')
    origin = store.show('origin')
    store.snapshot('origin', 'snap-rw')
    store.snapshot('origin', 'snap-ro', readonly=True)
    rw, ro = store.show('snap-rw'), store.show('snap-ro')
    t.check_equal(rw['readonly'], False, 'snapshot without -r: readonly')
    t.check_equal(ro['readonly'], True, 'snapshot -r: readonly')
    t.check_equal(rw['parent_uuid'], origin['uuid'], 'snapshot parent_uuid')
    t.check_equal(ro['parent_uuid'], origin['uuid'], 'read-only snapshot parent_uuid')
    t.check_equal(store.show('origin')['readonly'], False, 'origin stays writable')
    store.snapshot('snap-ro', 'snap-of-ro')
    t.check_equal(store.show('snap-of-ro')['readonly'], False, 'writable snapshot of a read-only one')

    r = store.run('subvolume', 'snapshot', 'no-such-source', 'x', expect='fail')
    check_mentions(r, 'no-such-source', 'snapshot of a missing source')
    t.check('x' not in store.names(), 'a failed snapshot left a subvolume')

    store.create('dup-name-1')
    r = store.run('subvolume', 'create', 'dup-name-1', expect='fail')
    check_mentions(r, 'dup-name-1', 'create of a duplicate name')
    r = store.run('subvolume', 'snapshot', 'origin', 'dup-name-1', expect='fail')
    check_mentions(r, 'dup-name-1', 'snapshot onto a taken name')
    t.check_equal(store.names().count('dup-name-1'), 1, 'duplicates listed')


def test_rename_and_readonly(store):
    """subvolume rename keeps the subvolume (its ID, UUID and files) under
    its new name, and refuses a taken name, a missing subvolume and a name
    kept for receives; set-readonly makes a subvolume read-only and
    writable again (then with a new top layer and without the UUID it was
    received with), and refuses what is neither true nor false."""
    store.create('to-rename')
    before = store.show('to-rename')
    r = store.run('subvolume', 'rename', 'to-rename', 'renamed')
    t.check_equal(r.out, "Renamed subvolume 'to-rename' to 'renamed'.\n", 'rename says what it did')
    after = store.show('renamed')
    t.check_equal((after['id'], after['uuid']), (before['id'], before['uuid']), 'the renamed subvolume')
    t.check('to-rename' not in store.names(), 'the old name after a rename')
    store.create('taken')
    r = store.run('subvolume', 'rename', 'renamed', 'taken', expect=1)
    check_mentions(r, 'taken', 'rename onto a taken name')
    r = store.run('subvolume', 'rename', 'to-rename', 'x', expect=1)
    check_mentions(r, 'to-rename', 'rename of a missing subvolume')
    r = store.run('subvolume', 'rename', 'renamed', '.receiving-x', expect=2)
    check_mentions(r, '.receiving-', 'rename to a name kept for receives')
    r = store.run('subvolume', 'rename', 'renamed', 'a/b', expect=2)
    check_mentions(r, 'not a valid subvolume name', 'rename to an invalid name')
    t.check_equal(store.json('subvolume', 'rename', 'renamed', 'renamed-2')['id'], before['id'],
                  'rename --json prints the subvolume')

    for value in ('true', 'yes', '1'):
        store.run('subvolume', 'set-readonly', 'renamed-2', value)
        t.check_equal(store.show('renamed-2')['readonly'], True, f'set-readonly {value}')
    frozen = store.show('renamed-2')['top_layer']
    store.snapshot('renamed-2', 'of-readonly', readonly=True)
    doc = store.json('subvolume', 'set-readonly', 'renamed-2', 'false')
    t.check(doc['readonly'] is False and doc['top_layer'] != frozen,
            f'set-readonly false: writable, on a new top layer: {doc}')
    r = store.run('subvolume', 'set-readonly', 'renamed-2', 'maybe', expect=2)
    check_mentions(r, 'maybe', 'set-readonly with neither true nor false')
    r = store.run('subvolume', 'set-readonly', 'no-such', 'true', expect=1)
    check_mentions(r, 'no-such', 'set-readonly of a missing subvolume')

    # One received is no longer the image its sender has, once writable.
    stream = os.path.join(store.tmp, 'renamed.stream')
    store.run('send', '-f', stream, 'of-readonly')
    store.delete('of-readonly')
    received = store.run('receive', '-f', stream, 'got').out
    t.check(store.show('got')['received_uuid'], f'a received image has its UUID: {received}')
    store.run('subvolume', 'set-readonly', 'got', 'false')
    t.check_equal(store.show('got')['received_uuid'], None, 'the received UUID once writable')
    for name in ('got', 'renamed-2', 'taken'):
        store.delete(name)


def test_readonly_while_mounted(store):
    """A mounted subvolume is neither made read-only nor writable: the
    refusal names the process that has it mounted."""
    t.require_fuse()
    store.create('mounted')
    with store.mount('mounted'):
        r = store.run('subvolume', 'set-readonly', 'mounted', 'true', expect=1)
        t.check('is mounted by' in r.err and 'unmount it' in r.err, f'set-readonly of a mounted one:\n{r.describe()}')
        r = store.run('subvolume', 'rename', 'mounted', 'mounted-renamed')
    t.check_equal(store.show('mounted-renamed')['readonly'], False, 'the subvolume once unmounted')
    store.delete('mounted-renamed')


def test_misuse(store):
    cases = [
        ['frobnicate'],
        [],
        ['subvolume'],
        ['subvolume', 'frobnicate'],
        ['subvolume', 'create'],
        ['subvolume', 'create', 'a', 'b'],
        ['subvolume', 'snapshot', 'alpha'],
        ['subvolume', 'snapshot'],
        ['subvolume', 'delete'],
        ['subvolume', 'show'],
        ['subvolume', 'create', '--bogus-option', 'a'],
        ['mount', 'alpha'],
        ['mount'],
        ['--bogus-option', 'subvolume', 'list'],
        ['reap', 'extra-argument'],
    ]
    before = store.names()
    for args in cases:
        r = store.run(*args, expect='fail')
        if args and args[0] == 'frobnicate':
            check_mentions(r, 'frobnicate', 'unknown command')
    t.check_equal(store.names(), before, 'subvolumes after misuse')
    # No IDs to map would be no user namespace: the task would run as root.
    r = store.run('run', '--user-namespace', '100000:0', 'alpha', '--', 'true', expect=2)
    check_mentions(r, 'SIZE above 0', 'run --user-namespace BASE:0')
    # A name that is no capability, or no refused call, would widen nothing.
    for option, name in (('--keep-capability', 'cap_net_admin'), ('--keep-capability', 'CAP_NET_ADMN'),
                         ('--allow-syscall', 'no_such_call'), ('--allow-syscall', 'read')):
        r = store.run('run', option, name, 'alpha', '--', 'true', expect=2)
        check_mentions(r, name, f'run {option} {name}')
    # Numbers past what the store keeps (a signed 64-bit integer) are
    # usage errors that say so, and change nothing.
    settings = store.json('reap', '--rate', '1M')
    for args in (['reap', '--rate', '18446744073709551615'], ['reap', '--rate', '99999999999999999999'],
                 ['reap', '--rate', '8388608T'], ['subvolume', 'set-quota', 'alpha', '18446744073709551615'],
                 ['subvolume', 'set-quota', 'alpha', '99999999999999999999']):
        r = store.run(*args, expect=2)
        check_mentions(r, 'too large', ' '.join(args))
    t.check_equal(store.json('reap', '--rate', '1M'), settings, 'the reaper settings after refused rates')
    store.run('reap', '--rate', 'none')
    t.check_equal(store.show('alpha')['quota_bytes'], 0, 'the quota after refused sizes')
    r = store.run('mount', 'no-such-subvolume', store.new_dir('mnt'), expect='fail')
    check_mentions(r, 'no-such-subvolume', 'mount of a missing subvolume')
    # In the background the server reports it before it leaves, and the
    # command fails with it.
    mnt = store.new_dir('mnt-background')
    r = store.run('mount', '--background', 'no-such-subvolume', mnt, expect='fail')
    check_mentions(r, 'no-such-subvolume', 'mount --background of a missing subvolume')
    t.check('mounted' not in r.out.lower(), f'a failed mount --background says it mounted:\n{r.describe()}')
    t.check(not t.is_mounted(mnt), f'a failed mount --background left {mnt} mounted')
    missing = os.path.join(store.tmp, 'no-store-here')
    r = t.run_command([t.tool(), '--store', missing, 'mount', '--background', 'alpha', mnt], expect='fail')
    check_mentions(r, 'init', 'mount --background on a missing store (should say how to create one)')


def test_send_output(store):
    """send -f FILE: a send that fails leaves FILE as it was, and no file
    beside it; one that works replaces it; a FIFO or /dev/null is written
    as it is, and the send succeeds."""
    store.create('send-src')
    store.snapshot('send-src', 'send-img', readonly=True)
    out = store.new_dir('send-out')
    path = os.path.join(out, 'image.stream')
    t.write_file(path, b'an older stream')
    for args in (['no-such-image'], ['send-src'], ['-p', 'no-such-parent', 'send-img']):
        r = store.run('send', '-f', path, *args, expect='fail')
        t.check_equal(t.read_file(path), b'an older stream', f'the file after a failed send {args}:\n{r.describe()}')
    r = t.run_command([t.tool(), '--store', os.path.join(store.tmp, 'no-store-here'), 'send', '-f', path, 'x'],
                      expect='fail')
    t.check_equal(t.read_file(path), b'an older stream', f'the file after a send from no store:\n{r.describe()}')
    t.check_equal(os.listdir(out), ['image.stream'], 'files beside the stream after failed sends')

    store.run('send', '-f', path, 'send-img')
    stream = t.read_file(path)
    t.check(stream.startswith(b'btrfs-stream\0'), f'the stream written: {stream[:32]!r}')
    t.check_equal(os.listdir(out), ['image.stream'], 'files beside the stream after a send')
    t.check_equal(os.stat(path).st_mode & 0o777, 0o644, 'the mode of the stream file')

    fifo = os.path.join(out, 'fifo')
    os.mkfifo(fifo)
    reader = subprocess.Popen(['cat', fifo], stdout=subprocess.PIPE)
    store.run('send', '-f', fifo, 'send-img')
    t.check_equal(reader.communicate(timeout=60)[0], stream, 'the stream read from a FIFO')
    store.run('send', '-f', '/dev/null', 'send-img')
    t.check(os.path.exists('/dev/null') and not os.path.isfile('/dev/null'), '/dev/null after a send to it')


def test_receiving_names(store):
    """Names starting with '.receiving-' are those of images being
    received: no command makes one, and a receive, which deletes those left
    by receives that died, leaves alone any other name that starts so."""
    store.create('rcv-src')
    store.snapshot('rcv-src', 'rcv-img', readonly=True)
    stream = os.path.join(store.new_dir('rcv'), 'stream')
    store.run('send', '-f', stream, 'rcv-img')
    store.run('subvolume', 'delete', 'rcv-img')
    for args in (['subvolume', 'create', '.receiving-1-1'], ['subvolume', 'snapshot', 'rcv-src', '.receiving-7'],
                 ['run', '--name', '.receiving-2-2', 'rcv-src', '--', 'true']):
        r = store.run(*args, expect=2)
        check_mentions(r, 'images being received', ' '.join(args))
    # As an older version let one be made.
    store.create('rcv-old')
    db = t.open_catalog(store.path)
    db.execute("UPDATE subvolumes SET name = '.receiving-old-backup' WHERE name = 'rcv-old'")
    db.commit()
    db.close()
    store.run('receive', '-f', stream)
    names = store.names()
    t.check('.receiving-old-backup' in names and 'rcv-img' in names, f'subvolumes after a receive: {names}')
    for name in ('rcv-img', 'rcv-src', '.receiving-old-backup'):
        store.run('subvolume', 'delete', name)


def test_uuid_index(store):
    """The catalog finds a subvolume by UUID through an index (every
    snapshot looks its UUID up), also in a store made before the index,
    which the next opening gives one."""
    catalog = os.path.join(store.path, 'catalog.db')

    def plan():
        db = sqlite3.connect(catalog)
        try:
            return ' '.join(str(row) for row in db.execute(
                "EXPLAIN QUERY PLAN SELECT 1 FROM subvolumes WHERE uuid = 'x'"))
        finally:
            db.close()

    t.check('subvolumes_uuid' in plan(), f'the lookup of a UUID in a new store: {plan()}')
    db = sqlite3.connect(catalog)
    db.execute('DROP INDEX subvolumes_uuid')
    db.commit()
    db.close()
    store.run('subvolume', 'list')
    t.check('subvolumes_uuid' in plan(), f'the lookup of a UUID in a store opened again: {plan()}')


def test_json(store):
    doc = t.json_usage(store.json('usage'))
    for key in ('logical_bytes', 'stored_bytes', 'data_bytes', 'pack_file_bytes', 'reclaimable_bytes'):
        t.check(doc[key] >= 0, f'usage {key} = {doc[key]}')
    names = {s.get('name') for s in doc['subvolumes']}
    t.check_equal(names, set(store.names()), 'subvolumes in usage --json')
    t.json_usage_subvolume(doc, 'alpha')
    text = store.run('usage').out
    t.check('alpha' in text, f'usage does not list subvolume alpha:\n{text}')


def test_maintenance(store):
    store.run('reap')
    store.reap()
    # A bad setting is a usage error that changes nothing, the others with it.
    for args in (['--pause', '--rate', 'fast'], ['--rate', '-1'], ['--pause', '--resume'], ['--wait', '--pause']):
        store.run('reap', *args, expect=2)
    t.check_equal(store.json('reap', '--rate', 'none'), {'paused': False, 'rate_bytes_per_sec': 0, 'hurried': False},
                  'reaper settings after the bad ones')
    store.run('scrub')
    store.fsck()
    store.fsck(repair=True)


def test_reap_busy(store):
    """A reap that cannot get at the catalog (another process writes to it
    for longer than the store waits, 30 s) fails with a sentence that says
    so, and the next reap does the work."""
    store.create('busy')
    store.delete('busy', reap=False)
    holder = sqlite3.connect(os.path.join(store.path, 'catalog.db'), timeout=10, isolation_level=None)
    try:
        holder.execute('BEGIN IMMEDIATE')
        r = store.run('reap', '--wait', expect='fail', timeout=120)
        t.check('kept its catalog or a layer' in r.err and 'try again' in r.err,
                f'reap with the catalog locked by another process:\n{r.describe()}')
    finally:
        holder.close()
    t.check_equal(store.json('reap', '--wait')['subvolumes_forgotten'], 1, 'the reap after the lock went')


def test_delete_racing(store):
    """Two deletes of one subvolume at once, and a snapshot of it beside
    them: one delete does it, the others find it gone. None of them is
    told that the subvolume is mounted (nobody mounted it): the first
    holds its lock for a moment only, here while it waits for a catalog
    that another process writes to."""
    store.create('racing')
    sid = store.show('racing')['id']
    lock = os.path.join(store.path, 'locks', f'subvolume-{sid}.lock')
    holder = sqlite3.connect(os.path.join(store.path, 'catalog.db'), timeout=10, isolation_level=None)
    try:
        holder.execute('BEGIN IMMEDIATE')
        first = subprocess.Popen([t.tool(), '--store', store.path, 'subvolume', 'delete', '--no-reap', 'racing'],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not (os.path.exists(lock) and t.read_file(lock).split()[:1] == [str(first.pid).encode()]):
            t.check(time.monotonic() < deadline and first.poll() is None,
                    'the first delete did not take the subvolume\'s lock')
            time.sleep(0.01)
        second = subprocess.Popen([t.tool(), '--store', store.path, 'subvolume', 'delete', '--no-reap', 'racing'],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        snap = subprocess.Popen([t.tool(), '--store', store.path, 'subvolume', 'snapshot', 'racing', 'racing-snap'],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1)
    finally:
        holder.close()
    out, err = first.communicate(timeout=60)
    t.check_equal(first.returncode, 0, f'the first delete: {out}{err}')
    for what, p in (('the second delete', second), ('the snapshot', snap)):
        out, err = p.communicate(timeout=60)
        t.check(p.returncode != 0 and "no subvolume named 'racing'" in err and 'mounted' not in err,
                f'{what} of a subvolume deleted meanwhile should find it gone (status {p.returncode}): {out}{err}')
    t.check('racing' not in store.names() and 'racing-snap' not in store.names(),
            f'subvolumes after the racing deletes: {store.names()}')


def check_progress_on_terminal(store, args, label, summary):
    """Runs the command with standard error on a terminal: it succeeds, its
    progress line ("label: N MiB of N MiB (P%)", label a pattern) reaches
    100% and is then removed, and it prints summary; what it showed."""
    code, out, term = t.run_on_terminal([t.tool(), '--store', store.path] + args)
    t.check_equal(code, 0, f'{args[0]} on a terminal (it printed {out!r}, {term!r})')
    t.check(re.search(rf'\r{label}: [0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B \(100%\)\x1b\[K\r\x1b\[K$',
                      term),
            f'{args[0]} showed no progress "{label}: ..." reaching 100%, then removed, on the terminal: {term!r}')
    t.check(summary in out, f'{args[0]} printed no {summary!r}: {out!r}')
    return term


def check_no_progress_in_file(store, command, label):
    r = store.run(command)
    t.check('\r' not in r.err and f'{label}:' not in r.err, f'{command} showed progress in a file:\n{r.describe()}')


def test_progress(store):
    """Long work shows a progress line on a terminal, rewritten in place and
    removed at the end, and nothing of it when standard error is a file."""
    image = os.path.join(t.source_root(), 'tests', 'fuzz-corpus', 'btrfs-v1-full')
    term = check_progress_on_terminal(store, ['receive', '-f', image, 'progress-image'], 'receiving[^:]*', '')
    t.check('\rreceiving progress-image: ' in term, f'receive did not name the image in its progress: {term!r}')
    check_progress_on_terminal(store, ['scrub'], 'scrub', 'Blocks checked')
    check_no_progress_in_file(store, 'scrub', 'scrub')
    check_progress_on_terminal(store, ['fsck'], 'fsck', 'No problems found')
    check_no_progress_in_file(store, 'fsck', 'fsck')

    store.delete('progress-image', reap=False)
    t.check(store.usage()['reclaimable_bytes'] > 0, 'nothing waits to be freed after a delete without a reap')
    check_progress_on_terminal(store, ['reap', '--wait'], 'reap', 'Space freed')
    t.check_equal(store.usage()['reclaimable_bytes'], 0, 'bytes waiting to be freed after the reap')


def test_lock_files_pruned(store):
    """The reaper removes the lock file of every subvolume it forgets: a
    build farm makes and deletes a snapshot per patch, and one file each
    would pile up for ever. A lock file still held, and one of an id not
    handed out yet, stay."""
    locks = os.path.join(store.path, 'locks')

    def lock_file(sid):
        return os.path.join(locks, f'subvolume-{sid}.lock')

    store.create('lock-keep')
    keep = store.show('lock-keep')['id']
    gone = []
    for i in range(3):
        store.snapshot('lock-keep', f'lock-gone-{i}')
        gone.append(store.show(f'lock-gone-{i}')['id'])
        store.delete(f'lock-gone-{i}', reap=False)
    for sid in [keep] + gone:
        t.check(os.path.exists(lock_file(sid)), f'no lock file for subvolume {sid} to begin with')
    future = lock_file(max(gone) + 1000)
    t.write_file(future, b'')
    with open(lock_file(gone[0])) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        store.reap()
        t.check(os.path.exists(lock_file(gone[0])), 'the reaper removed a lock file that was held')
    for sid in gone[1:]:
        t.check(not os.path.exists(lock_file(sid)), f'the lock file of forgotten subvolume {sid} is still there')
    t.check(os.path.exists(lock_file(keep)), 'the reaper removed the lock file of a live subvolume')
    t.check(os.path.exists(future), 'the reaper removed the lock file of an id not handed out yet')
    store.reap()
    t.check(not os.path.exists(lock_file(gone[0])), 'a lock file let go of is still there after the next reap')
    os.unlink(future)
    store.snapshot('lock-keep', 'lock-after')
    store.delete('lock-keep')
    store.delete('lock-after')


def test_help(store):
    """Every command's --help: on standard output, naming the command, in
    lines that fit a terminal of 80 columns; and the other programs' too."""
    commands = [
        [], ['init'], ['subvolume'], ['subvolume', 'create'], ['subvolume', 'snapshot'],
        ['subvolume', 'delete'], ['subvolume', 'list'], ['subvolume', 'show'], ['subvolume', 'set-quota'],
        ['mount'], ['usage'], ['reap'], ['scrub'], ['fsck'], ['receive'], ['send'], ['run'], ['help'],
    ]
    missing = os.path.join(store.tmp, 'no-store-for-help')
    for args in commands:
        # --help needs no store.
        r = t.run_command([t.tool(), '--store', missing] + args + ['--help'])
        t.check('usage' in r.out.lower(), f'--help prints no usage on stdout:\n{r.describe()}')
        if args:
            t.check(args[-1] in r.out, f'--help of {" ".join(args)} does not name the command:\n{r.describe()}')
        check_fits(r.out, f'cowbox-store {" ".join(args)} --help')
    t.check(not os.path.exists(missing), '--help created a store')
    build = os.path.dirname(os.path.dirname(t.tool()))
    for program in (os.path.join(build, 'cli', 'cowbox'), os.path.join(build, 'daemon', 'cowboxd')):
        check_fits(t.run_command([program, '--help']).out, f'{os.path.basename(program)} --help')


def client():
    return os.path.join(os.path.dirname(os.path.dirname(t.tool())), 'cli', 'cowbox')


def test_client_usage(store):
    """cowbox's usage errors come before it calls the daemon (here there is
    no bus: a call would exit 69), exit 2, and name the command and the
    option as the user wrote them, in a message of cowbox's own."""
    env = {'DBUS_SYSTEM_BUS_ADDRESS': f'unix:path={store.tmp}/no-bus-here'}
    cases = [
        (['list', '-x'], ["'list'", "'-x'"]),
        (['run', '--frobnicate', 'base', '--', 'true'], ["'run'", "'--frobnicate'"]),
        (['run', '--timeout=5', '--bogus=3', 'base', '--', 'true'], ["'run'", "'--bogus'"]),
        (['run', '--keep=yes', 'base', '--', 'true'], ["'run'", "'--keep'", 'takes no value']),
        (['snapshot', '--read-only=1', 'a', 'b'], ["'snapshot'", "'--read-only'", 'takes no value']),
        (['run', '--timeout'], ["'run'", "'--timeout'", 'needs a value']),
        (['image', 'send', '--bogus', 'base'], ["'image send'", "'--bogus'"]),
        (['image', 'send', '-f'], ["'image send'", "'-f'", 'needs a value']),
        (['image', 'send', '--proto'], ["'image send'", "'--proto'", 'needs a value']),
        (['image', 'receive', '-x'], ["'image receive'", "'-x'"]),
        (['snapshot', '-rz', 'a', 'b'], ["'snapshot'", "'-z'"]),
        (['workspace', 'show', '--frobnicate'], ["'workspace show'", "'--frobnicate'"]),
        (['workspace', 'checkpoint', '-q', 'ws'], ["'workspace checkpoint'", "'-q'"]),
        (['workspace', 'create', 'ws', '--image', 'base', '--limit'], ["'workspace create'", "'--limit'"]),
        (['sandbox', 'create', 'x', '--image', 'base', '--frobnicate', '--', 'true'],
         ["'sandbox create'", "'--frobnicate'"]),
        (['status', '--json'], ['--json goes before the command', 'cowbox --json status']),
        # JSON numbers are signed: these would reach the daemon as -1 and 2^63.
        (['run', '--timeout', '18446744073709551615', 'base', '--', 'true'],
         ["'18446744073709551615'", '--timeout', 'too large']),
        (['sandbox', 'create', 'x', '--image', 'base', '--pids-max=9223372036854775808', '--', 'true'],
         ["'9223372036854775808'", '--pids-max', 'too large']),
    ]
    for argv, words in cases:
        r = t.run_command([client()] + argv, env=env, expect=2)
        lines = r.err.splitlines()
        t.check(lines and all(line.startswith('cowbox: ') for line in lines),
                f'cowbox {" ".join(argv)}: a message not of cowbox\'s own:\n{r.err}')
        t.check(all(w in r.err for w in words), f'cowbox {" ".join(argv)} does not say {words}:\n{r.err}')


def complete(store, function, words):
    """What the bash completion of contrib/ offers for the last of words."""
    completion = os.path.join(t.source_root(), 'contrib', 'cowbox.bash-completion')
    quoted = ' '.join(shlex.quote(w) for w in words)
    script = (f'source {shlex.quote(completion)}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; '
              f'{function}; printf "%s\\n" "${{COMPREPLY[@]}}"')
    path = os.path.dirname(t.tool()) + ':' + os.environ['PATH']
    r = t.run_command(['bash', '-c', script], env={'PATH': path, 'COWBOX_STORE': store.path})
    return set(r.out.split())


def help_options(text):
    """The long options of the lines of an "Options:" section of a help."""
    section = text.split('\nOptions:\n', 1)[1].split('\n\n', 1)[0]
    return set(re.findall(r'^ +(?:-[a-zA-Z], )?(--[a-z-]+)', section, re.M))


def test_completion(store):
    """The bash completion offers every command and every option the
    programs' help lists, for cowbox-store and cowbox, and names from the
    store."""
    top = t.run_command([t.tool(), '--help']).out
    commands = set(re.findall(r'^  ([a-z-]+)', top.split('\nCommands:\n', 1)[1].split('\n\n', 1)[0], re.M))
    offered = complete(store, '_cowbox_store', ['cowbox-store', ''])
    t.check(commands and commands <= offered, f'completion of cowbox-store: {sorted(offered)}, not {sorted(commands)}')
    subvolume_verbs = set(re.findall(r'^  subvolume ([a-z-]+)', top, re.M))
    offered = complete(store, '_cowbox_store', ['cowbox-store', 'subvolume', ''])
    t.check(len(subvolume_verbs) > 5 and subvolume_verbs <= offered,
            f'completion of cowbox-store subvolume: {sorted(offered)}, not {sorted(subvolume_verbs - offered)}')
    for args in [['subvolume', verb] for verb in sorted(subvolume_verbs)] + [
            ['mount'], ['usage'], ['reap'], ['scrub'], ['fsck'], ['receive'], ['send'], ['run']]:
        want = help_options(t.run_command([t.tool()] + args + ['--help']).out)
        offered = complete(store, '_cowbox_store', ['cowbox-store'] + args + ['--'])
        t.check(want and want <= offered, f'completion of cowbox-store {" ".join(args)} --: {sorted(offered)}, '
                f'not {sorted(want - offered)}')
    store.create('completed-name')
    t.check('completed-name' in complete(store, '_cowbox_store', ['cowbox-store', 'subvolume', 'show', '']),
            'completion of cowbox-store subvolume show offers no subvolume')
    store.delete('completed-name')

    text = t.run_command([client(), '--help']).out
    synopsis = text.split('\n  run ', 1)[1].split(' IMAGE -- ', 1)[0]
    run_options = set(re.findall(r'--[a-z-]+', synopsis))
    words = (['cowbox', 'run', '--'], run_options),
    words += (['cowbox', 'sandbox', 'create', 'x', '--'], run_options - {'--keep', '--name'} | {'--image'}),
    create = text.split('\n  workspace create ', 1)[1].split('\n  workspace list', 1)[0]
    words += (['cowbox', 'workspace', 'create', 'x', '--'], set(re.findall(r'--[a-z-]+', create))),
    for argv, want in words:
        offered = complete(store, '_cowbox', argv)
        t.check(len(want) > 2 and want <= offered, f'completion of {" ".join(argv)}: {sorted(offered)}, '
                f'not {sorted(want - offered)}')
    t.check_equal(complete(store, '_cowbox', ['cowbox', 'rm', '-']), set(), "completion of 'cowbox rm -'")


def test_daemon_store_errors(store):
    """cowboxd says what is wrong with a store in the store's own words, as
    cowbox-store does, not in an errno's ("Protocol error")."""
    daemon = os.path.join(os.path.dirname(os.path.dirname(t.tool())), 'daemon', 'cowboxd')
    env = {'DBUS_SYSTEM_BUS_ADDRESS': f'unix:path={store.tmp}/no-bus-here'}
    full = store.new_dir('daemon-not-empty')
    t.write_file(os.path.join(full, 'precious'), b'data')
    r = t.run_command([daemon, '--store', full, '--init'], env=env, expect=1)
    check_mentions(r, 'not empty and holds no store', 'cowboxd --init of a directory with files')
    newer = os.path.join(store.new_dir('daemon-newer'), 'store')
    t.run_command([t.tool(), '--store', newer, 'init'])
    db = t.open_catalog(newer)
    with db:
        db.execute("UPDATE meta SET value = 1000 WHERE key = 'format'")
    db.close()
    r = t.run_command([daemon, '--store', newer], env=env, expect=1)
    check_mentions(r, 'format is newer', 'cowboxd on a store of a newer format')


def test_daemon_usage(store):
    """cowboxd's usage errors exit 2 before it opens anything: an empty or
    bad percent, and a high mark below the low one, which it used to raise
    in silence; a low mark alone lifts the default high mark."""
    daemon = os.path.join(os.path.dirname(os.path.dirname(t.tool())), 'daemon', 'cowboxd')
    env = {'DBUS_SYSTEM_BUS_ADDRESS': f'unix:path={store.tmp}/no-bus-here'}
    missing = os.path.join(store.tmp, 'no-store-for-cowboxd')
    for args, words in ((['--reap-low-mark', ''], ['0 to 100']), (['--reap-high-mark', '101'], ['0 to 100']),
                        (['--reap-low-mark', '30', '--reap-high-mark', '20'], ['(20%)', '(30%)', 'below']),
                        (['--reap-high-mark', '5'], ['(5%)', '(10%)', 'below']), (['extra'], ["'extra'"])):
        r = t.run_command([daemon, '--store', missing] + args, env=env, expect=2)
        t.check(all(w in r.err for w in words), f'cowboxd {" ".join(args)} does not say {words}:\n{r.err}')
    r = t.run_command([daemon, '--store', missing, '--reap-low-mark', '30'], env=env, expect=1)
    check_mentions(r, '--init', 'cowboxd --reap-low-mark 30 on a missing store')
    t.check(not os.path.exists(missing), 'cowboxd made a store it was not asked to')
    t.check('Exit status' in t.run_command([daemon, '--help']).out, 'cowboxd --help gives no exit status')


def bus_policy_dirs():
    """The directories the system bus reads policies from (its includedir
    elements; relative ones are relative to its configuration)."""
    config = '/usr/share/dbus-1/system.conf'
    if not os.path.exists(config):
        return {'/usr/share/dbus-1/system.d', '/etc/dbus-1/system.d'}
    dirs = re.findall(r'<includedir>([^<]+)</includedir>', open(config).read())
    return {os.path.normpath(os.path.join(os.path.dirname(config), d)) for d in dirs}


def test_install(store):
    """'meson install' puts contrib/ where the system reads it, whatever the
    prefix: the bus policy in a directory the system bus reads, the unit
    and the completions of both programs."""
    if not shutil.which('meson'):
        print('SKIP: meson install: no meson here', flush=True)
        return
    root = store.new_dir('install')
    build = os.path.dirname(os.path.dirname(t.tool()))
    t.run_command(['meson', 'install', '-C', build, '--destdir', root, '--no-rebuild', '--quiet'])
    installed = {}
    for top, _, files in os.walk(root):
        for name in files:
            installed.setdefault(name, []).append('/' + os.path.relpath(top, root))
    policy = installed.get('org.cowbox1.conf', [])
    t.check(len(policy) == 1 and policy[0] in bus_policy_dirs(),
            f'the bus policy is installed in {policy}, where the system bus reads none: it reads {bus_policy_dirs()}')
    t.check(any(d.endswith('/systemd/system') for d in installed.get('cowboxd.service', [])),
            f'the unit is installed in {installed.get("cowboxd.service")}')
    for program in ('cowbox', 'cowbox-store'):
        t.check(any(d.endswith('/bash-completion/completions') for d in installed.get(program, [])),
                f'no bash completion of {program} installed: {installed.get(program)}')


def test_service_unit(store):
    """contrib/cowboxd.service, as meson installs it, passes systemd-analyze
    verify (which runs man for every man: page it names), and stopping it
    stops the daemon alone: the FUSE servers of workspaces live in its
    cgroup and must outlive a restart (the daemon ends its jobs and tasks
    itself)."""
    source = open(os.path.join(t.source_root(), 'contrib', 'cowboxd.service')).read()
    daemon = os.path.join(os.path.dirname(os.path.dirname(t.tool())), 'daemon')
    unit = os.path.join(store.new_dir('unit'), 'cowboxd.service')
    t.write_file(unit, source.replace('@sbindir@', daemon).encode())
    service = source.split('[Service]', 1)[1].split('\n[', 1)[0]
    kill_modes = re.findall(r'^KillMode=(.*)$', service, re.M)
    t.check_equal(kill_modes, ['process'], 'the KillMode of cowboxd.service')
    # Settings that give the service a mount namespace of its own (systemd's
    # exec_needs_mount_namespace()), where its FUSE mounts would stay, or a
    # device policy that shuts /dev/fuse.
    private = re.findall(r'^((?:Protect(?:System|Home|KernelTunables|KernelModules|KernelLogs|ControlGroups|Proc|'
                         r'Hostname|Clock)|Private(?:Tmp|Devices|Mounts|IPC)|ProcSubset|(?:ReadWrite|ReadOnly|'
                         r'Inaccessible|Exec|NoExec)Paths|Bind(?:ReadOnly)?Paths|TemporaryFileSystem|RootDirectory|'
                         r'RootImage|MountFlags|DeviceAllow|DevicePolicy)=.*)$', service, re.M)
    t.check_equal(private, [], 'settings of cowboxd.service that would hide its mounts or /dev/fuse')
    if not shutil.which('systemd-analyze'):
        print('SKIP: systemd-analyze verify: no systemd-analyze here', flush=True)
        return
    r = t.run_command(['systemd-analyze', 'verify', unit], expect=None)
    said = [line for line in (r.out + r.err).splitlines() if 'cowboxd.service' in line]
    t.check(r.code == 0 and not said, f'systemd-analyze verify of cowboxd.service:\n{r.describe()}')


def test_install_deps_waits_for_apt(store):
    """scripts/install-deps on a machine just booted, where apt's daily job
    holds apt's locks for a while: it waits for them instead of failing,
    whatever the language of apt's messages."""
    if os.environ.get('COWBOX_SKIP_INSTALL') == '1':
        print('SKIP: install-deps: COWBOX_SKIP_INSTALL=1', flush=True)
        return
    if os.geteuid() != 0 or not shutil.which('apt-get') or not os.path.isdir('/var/lib/dpkg'):
        print('SKIP: install-deps: needs root and apt-get', flush=True)
        return
    held = []
    try:
        for path in ('/var/lib/apt/lists/lock', '/var/lib/dpkg/lock-frontend'):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
            held.append(fd)
            fcntl.lockf(fd, fcntl.LOCK_EX)
        script = os.path.join(t.source_root(), 'scripts', 'install-deps')
        # An administrator's language: apt's messages are translated.
        p = subprocess.Popen([script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, LC_ALL='C.UTF-8', LANGUAGE='de'))
        time.sleep(8)
    finally:
        for fd in held:
            os.close(fd)
    out, _ = p.communicate(timeout=900)
    t.check(p.returncode == 0 and 'waiting for it' in out,
            f'install-deps while another apt held its locks: exit status {p.returncode}:\n{out}')


def test_client_help(store):
    """'cowbox COMMAND --help' (also after some options) prints the help of
    that command's group on standard output and exits 0, without the bus;
    after a task's image, --help is the task's."""
    env = {'DBUS_SYSTEM_BUS_ADDRESS': f'unix:path={store.tmp}/no-bus-here'}
    for argv, section in ((['image', '--help'], 'image receive'), (['image', 'send', '-h'], 'image send'),
                          (['image', 'receive', '--help'], 'image receive'), (['list', '--help'], 'snapshot'),
                          (['snapshot', '-r', '--help'], 'snapshot [-r]'), (['rm', '--help'], 'rm NAME'),
                          (['run', '--help'], 'run [--workdir'), (['run', '--timeout', '5', '--help'], 'IMAGE --'),
                          (['sandbox', '--help'], 'sandbox create'), (['sandbox', 'create', '--help'], 'LIMITS'),
                          (['sandbox', 'create', 'x', '--image', 'base', '--help'], 'sandbox start'),
                          (['sandbox', 'wait', '--help'], 'sandbox wait'), (['workspace', '-h'], 'set-limit'),
                          (['workspace', 'create', '--help'], '--owner'),
                          (['workspace', 'checkpoint', '--help'], 'checkpoint NAME'),
                          (['status', '--help'], 'scrub'), (['cancel', '--help'], 'cancel ID')):
        r = t.run_command([client()] + argv, env=env)
        t.check(r.out.startswith(f'Usage: cowbox [--json] {argv[0]} ') and section in r.out and 'Exit status' in r.out,
                f'cowbox {" ".join(argv)}: no help of its commands:\n{r.describe()}')
        check_fits(r.out, f'cowbox {" ".join(argv)}')
    # The task's own --help: run goes on to the (absent) bus.
    t.run_command([client(), 'run', 'base', 'ls', '--help'], env=env, expect=69)


def check_fits(text, what):
    long = [line for line in text.splitlines() if len(line) > 80]
    t.check(not long, f'{what}: lines wider than 80 columns:\n' + '\n'.join(long))


def test_version(store):
    r = t.run_command([t.tool(), '--version'])
    version = t.project_version()
    t.check(version in r.out, f'--version does not print {version}:\n{r.describe()}')


def run():
    with t.Store('cli') as store:
        sub = t.Subtests()
        sub.run('init', test_init, store)
        sub.run('init refuses a non-empty directory', test_init_non_empty_dir, store)
        sub.run('missing store', test_missing_store, store)
        sub.run('store from $COWBOX_STORE', test_store_from_environment, store)
        sub.run('create, list, show, delete', test_create_list_show_delete, store)
        sub.run('invalid names', test_invalid_names, store)
        sub.run('snapshots', test_snapshots, store)
        sub.run('rename and set-readonly', test_rename_and_readonly, store)
        sub.run('set-readonly while mounted', test_readonly_while_mounted, store)
        sub.run('misuse', test_misuse, store)
        sub.run('send -f FILE', test_send_output, store)
        sub.run('names of images being received', test_receiving_names, store)
        sub.run('json', test_json, store)
        sub.run('UUIDs are indexed', test_uuid_index, store)
        sub.run('reap, scrub, fsck', test_maintenance, store)
        sub.run('reap while the catalog is locked', test_reap_busy, store)
        sub.run('deletes racing', test_delete_racing, store)
        sub.run('progress on a terminal', test_progress, store)
        sub.run('lock files of forgotten subvolumes', test_lock_files_pruned, store)
        sub.run('help', test_help, store)
        sub.run('usage errors of cowbox', test_client_usage, store)
        sub.run('help of cowbox\'s commands', test_client_help, store)
        sub.run('contrib/cowboxd.service', test_service_unit, store)
        sub.run('meson install', test_install, store)
        sub.run('cowboxd names what is wrong with a store', test_daemon_store_errors, store)
        sub.run('usage errors of cowboxd', test_daemon_usage, store)
        sub.run('bash completion', test_completion, store)
        sub.run('install-deps waits for apt\'s locks', test_install_deps_waits_for_apt, store)
        sub.run('version', test_version, store)
        sub.check()


t.main(run)
