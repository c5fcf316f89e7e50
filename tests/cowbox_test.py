# SPDX-License-Identifier: LGPL-2.1-or-later
"""Helpers shared by cowbox's tests (Python 3 standard library only).

A test is a script run by `meson test`: exit 0 passes, 1 fails, 77 skips
(with the reason printed). The environment names the parts under test:

  COWBOX_STORE_TOOL   the cowbox-store executable
  COWBOX_SOURCE_ROOT  the project's source tree
  COWBOX_BUILD_ROOT   the build directory
  COWBOX_TEST_TMPDIR  where temporary stores go (default /var/tmp)
  COWBOX_KEEP_TMP=1   keep the temporary directory of a failed test

What the tool prints with --json is read only here (see the JSON section),
so that a change of its output touches one place.
"""

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import traceback

EXIT_SKIP = 77
KiB = 1024
MiB = 1024 * 1024

# --------------------------------------------------------------------------
# Outcomes


class Failure(Exception):
    """A check failed: the test fails with this message."""


class Skip(Exception):
    """The test cannot run here: it exits 77 with this reason."""


def fail(message):
    raise Failure(message)


def skip(reason):
    raise Skip(reason)


def main(fn):
    """Runs fn() and exits with the code of the test protocol."""
    try:
        fn()
    except Skip as e:
        print(f'SKIP: {e}', flush=True)
        sys.exit(EXIT_SKIP)
    except Failure as e:
        print(f'FAIL: {e}', flush=True)
        sys.exit(1)
    except BaseException:  # noqa: B036 - any other exception is a failure too
        traceback.print_exc()
        print('FAIL: unexpected exception', flush=True)
        sys.exit(1)
    print('PASS', flush=True)
    sys.exit(0)


class Subtests:
    """Runs independent checks one after the other and reports each, so that
    one failure does not hide the others."""

    def __init__(self):
        self.failed = []
        self.ran = 0

    def run(self, name, fn, *args, **kwargs):
        self.ran += 1
        start = time.monotonic()
        try:
            fn(*args, **kwargs)
        except Skip as e:
            print(f'skip {name}: {e}', flush=True)
            return
        except Failure as e:
            print(f'FAIL {name}: {e}', flush=True)
            self.failed.append(name)
            return
        except Exception:
            print(f'FAIL {name}: unexpected exception', flush=True)
            traceback.print_exc()
            sys.stderr.flush()
            self.failed.append(name)
            return
        print(f'ok   {name} ({time.monotonic() - start:.2f}s)', flush=True)

    def check(self):
        if self.failed:
            fail(f'{len(self.failed)} of {self.ran} subtests failed: {", ".join(self.failed)}')


# --------------------------------------------------------------------------
# Assertions that say what differs


def check(condition, message):
    if not condition:
        fail(message)


def check_equal(actual, expected, what):
    if actual != expected:
        fail(f'{what}: expected {expected!r}, got {actual!r}')


def _hex_window(data, offset, width=16):
    return data[offset:offset + width].hex(' ')


def first_difference(a, b):
    """The first offset where two byte strings differ, or None."""
    n = min(len(a), len(b))
    step = 4096
    for start in range(0, n, step):
        if a[start:start + step] != b[start:start + step]:
            for i in range(start, min(start + step, n)):
                if a[i] != b[i]:
                    return i
    if len(a) != len(b):
        return n
    return None


def check_bytes(actual, expected, what):
    if actual == expected:
        return
    off = first_difference(actual, expected)
    fail(f'{what}: {len(actual)} bytes read, {len(expected)} expected; first difference '
         f'at offset {off}: got [{_hex_window(actual, off)}], expected [{_hex_window(expected, off)}]')


def expect_errno(errnos, fn, *args, what=None, **kwargs):
    """Calls fn and checks that it fails with one of errnos (an int or a
    collection of them). Returns the OSError."""
    if isinstance(errnos, int):
        errnos = (errnos,)
    names = '/'.join(errno.errorcode.get(e, str(e)) for e in errnos)
    what = what or getattr(fn, '__name__', repr(fn))
    try:
        result = fn(*args, **kwargs)
    except OSError as e:
        if e.errno not in errnos:
            fail(f'{what}: expected {names}, got {errno.errorcode.get(e.errno, e.errno)} ({e})')
        return e
    fail(f'{what}: expected {names}, but it succeeded (returned {result!r})')


def errno_name(e):
    return errno.errorcode.get(e, str(e))


# --------------------------------------------------------------------------
# Content and files


def pattern_bytes(size, seed=0):
    """Compressible, position-dependent content (each 4 KiB line differs)."""
    out = bytearray()
    line = 0
    while len(out) < size:
        out += f'{seed:08x} line {line:010d} of a compressible pattern\n'.encode()
        line += 1
    return bytes(out[:size])


def random_bytes(size, seed):
    import random
    return random.Random(seed).randbytes(size)


def write_file(path, data, mode=0o644, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view[:4 * MiB])
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, 'rb') as f:
        return f.read()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while True:
            chunk = f.read(MiB)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def disk_usage(path):
    """Bytes allocated on disk (st_blocks) by everything under path."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


# Linux calls that os does not wrap.

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10


def renameat2(old, new, flags):
    f = _libc.renameat2
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    f.restype = ctypes.c_int
    if f(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old, None, new)


def fallocate(fd, mode, offset, length):
    f = getattr(_libc, 'fallocate64', None) or _libc.fallocate
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    f.restype = ctypes.c_int
    if f(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# --------------------------------------------------------------------------
# Tree comparison: type, mode, owner, size, content, symlink target, device
# numbers, xattrs, link counts and hard-link groups, mtime.

TYPE_NAMES = {
    stat.S_IFREG: 'file', stat.S_IFDIR: 'dir', stat.S_IFLNK: 'symlink',
    stat.S_IFCHR: 'chardev', stat.S_IFBLK: 'blockdev', stat.S_IFIFO: 'fifo',
    stat.S_IFSOCK: 'socket',
}


def _xattrs(path, prefixes):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    out = {}
    for name in names:
        if not name.startswith(prefixes):
            continue
        try:
            out[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError as e:
            out[name] = f'<error {errno_name(e.errno)}>'
    return out


def walk(root, top=None):
    """Yields (relative path, lstat result) for everything under root (not
    root itself), parents before children, names sorted; only under the
    top-level names in top if given."""
    stack = ['']
    while stack:
        rel = stack.pop()
        names = sorted(os.listdir(os.path.join(root, rel) if rel else root))
        if not rel and top is not None:
            names = [n for n in names if n in top]
        subdirs = []
        for name in names:
            p = os.path.join(rel, name) if rel else name
            st = os.lstat(os.path.join(root, p))
            yield p, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(p)
        stack.extend(reversed(subdirs))


def manifest(root, *, top=None, xattr_prefixes=('user.', 'trusted.'), contents=True):
    """Describes every entry under root (under the top-level names in top,
    if given) as a dict of attributes, keyed by relative path. Entries whose
    content cannot be read record the error."""
    entries = {}
    inodes = {}
    for rel, st in walk(root, top):
        path = os.path.join(root, rel)
        kind = stat.S_IFMT(st.st_mode)
        e = {
            'type': TYPE_NAMES.get(kind, oct(kind)),
            'mode': oct(stat.S_IMODE(st.st_mode)),
            'uid': st.st_uid,
            'gid': st.st_gid,
            'mtime_ns': st.st_mtime_ns,
            'nlink': st.st_nlink,
            'xattrs': _xattrs(path, xattr_prefixes),
        }
        if kind == stat.S_IFREG:
            e['size'] = st.st_size
            if contents:
                try:
                    e['sha256'] = sha256_file(path)
                except OSError as err:
                    e['sha256'] = f'<read error {errno_name(err.errno)}>'
        elif kind == stat.S_IFLNK:
            e['size'] = st.st_size
            e['target'] = os.readlink(path)
        elif kind in (stat.S_IFCHR, stat.S_IFBLK):
            e['rdev'] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if kind != stat.S_IFDIR:
            inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
        entries[rel] = e
    for paths in inodes.values():
        for rel in paths:
            entries[rel]['links'] = tuple(sorted(paths))
    return entries


def compare_manifests(a, b, *, label_a='a', label_b='b', mtime=True, dir_mtime=True,
                      owners=True, nlink=True):
    """Lists the differences between two manifests, one line each."""
    diffs = []
    for rel in sorted(a.keys() - b.keys()):
        diffs.append(f'{rel}: only in {label_a} ({a[rel]["type"]})')
    for rel in sorted(b.keys() - a.keys()):
        diffs.append(f'{rel}: only in {label_b} ({b[rel]["type"]})')
    for rel in sorted(a.keys() & b.keys()):
        ea, eb = a[rel], b[rel]
        if ea['type'] != eb['type']:
            diffs.append(f'{rel}: type {ea["type"]} in {label_a}, {eb["type"]} in {label_b}')
            continue
        keys = ['mode', 'size', 'sha256', 'target', 'rdev', 'xattrs', 'links']
        if owners:
            keys += ['uid', 'gid']
        if ea['type'] != 'dir':
            if nlink:
                keys.append('nlink')
            if mtime:
                keys.append('mtime_ns')
        elif mtime and dir_mtime:
            keys.append('mtime_ns')
        for key in keys:
            va, vb = ea.get(key), eb.get(key)
            if va != vb:
                diffs.append(f'{rel}: {key} is {va!r} in {label_a}, {vb!r} in {label_b}')
    return diffs


def compare_trees(a, b, top=None, **kwargs):
    """Compares two trees entry by entry (under the top-level names in top,
    if given); see compare_manifests() for the options. Content differences
    name the first differing offset."""
    ma, mb = manifest(a, top=top), manifest(b, top=top)
    kwargs.setdefault('label_a', a)
    kwargs.setdefault('label_b', b)
    diffs = compare_manifests(ma, mb, **kwargs)
    out = []
    for d in diffs:
        m = re.match(r'^(.*): sha256 is ', d)
        if m and ma[m.group(1)].get('size') == mb[m.group(1)].get('size'):
            rel = m.group(1)
            try:
                off = first_difference(read_file(os.path.join(a, rel)), read_file(os.path.join(b, rel)))
                d = f'{rel}: content differs, first at offset {off}'
            except OSError as e:
                d = f'{rel}: content differs ({e})'
        out.append(d)
    return out


def report_differences(diffs, what, limit=40):
    if diffs:
        shown = '\n  '.join(diffs[:limit])
        more = f'\n  ... and {len(diffs) - limit} more' if len(diffs) > limit else ''
        fail(f'{what}: {len(diffs)} differences:\n  {shown}{more}')


def assert_trees_equal(a, b, what=None, **kwargs):
    report_differences(compare_trees(a, b, **kwargs), what or f'{a} and {b} differ')


def assert_manifests_equal(a, b, what, **kwargs):
    report_differences(compare_manifests(a, b, **kwargs), what)


def free_bytes(path):
    """The free bytes of the file system under path, as others than root
    see them."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_file_system(path):
    """Takes every free block of the file system under path, as another
    program would (as root: the blocks ext4 keeps for root too). Returns
    the file that holds them."""
    filler = os.path.join(path, 'filler')
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        offset, size = 0, 4 * MiB
        while size >= 4096:
            try:
                os.posix_fallocate(fd, offset, size)
                offset += size
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                size //= 2
        os.fsync(fd)
    finally:
        os.close(fd)
    return filler


def copy_tree(src, dst):
    """Copies src to dst keeping modes, owners, times, xattrs and hard links."""
    r = subprocess.run(['cp', '-a', '--', src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f'cp -a {src} {dst} failed: {r.stderr.strip()}')


# --------------------------------------------------------------------------
# Prerequisites


def require_root(why):
    if os.geteuid() != 0:
        skip(f'needs root ({why})')


def require_fuse():
    """Skips unless this machine can mount FUSE file systems as the tests do
    (as root, with allow_other and device nodes)."""
    if not os.path.exists('/dev/fuse'):
        skip('no /dev/fuse (load the fuse module: modprobe fuse)')
    if shutil.which('fusermount3') is None:
        skip('fusermount3 not found (install the fuse3 package)')
    require_root('FUSE mounts with allow_other, chown and device nodes')
    try:
        fd = os.open('/dev/fuse', os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as e:
        skip(f'cannot open /dev/fuse: {e}')


def require_program(name):
    path = shutil.which(name)
    if path is None:
        skip(f'{name} not found')
    return path


def source_root():
    root = os.environ.get('COWBOX_SOURCE_ROOT')
    if not root:
        fail('COWBOX_SOURCE_ROOT is not set: run the tests with meson test')
    return root


def project_version():
    with open(os.path.join(source_root(), 'meson.build')) as f:
        m = re.search(r"version\s*:\s*'([^']+)'", f.read())
    if not m:
        fail('no version in meson.build')
    return m.group(1)


def env_int(name, default):
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value, 0)
    except ValueError:
        fail(f'{name}={value!r} is not a number')


def seeds(one_env, count_env, default_count):
    """The seeds of a seeded random test: the one one_env names (a replay),
    else count_env's number of them (default_count) from a random base."""
    import random
    if os.environ.get(one_env):
        return [env_int(one_env, 0)]
    base = random.SystemRandom().randrange(1, 1 << 31)
    return [base + i for i in range(env_int(count_env, default_count))]


# --------------------------------------------------------------------------
# Running cowbox-store


def tool():
    path = os.environ.get('COWBOX_STORE_TOOL')
    if not path:
        fail('COWBOX_STORE_TOOL is not set: run the tests with meson test')
    if not os.access(path, os.X_OK):
        fail(f'{path} is not an executable: build it first (ninja -C build)')
    return path


class Result:
    def __init__(self, argv, code, out, err, seconds):
        self.argv = argv
        self.code = code
        self.out = out
        self.err = err
        self.seconds = seconds

    @property
    def output(self):
        return self.out + self.err

    def describe(self):
        return (f'$ {" ".join(self.argv)}\nexit status {self.code}\n'
                f'--- stdout\n{self.out.rstrip()}\n--- stderr\n{self.err.rstrip()}')

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError as e:
            fail(f'output is not JSON ({e}):\n{self.describe()}')


def run_on_terminal(argv, timeout=120, env=None):
    """Runs a command with its standard error on a pseudo-terminal, as a
    user at a terminal sees it, and its standard output to a file; env is
    added to its environment. Returns the exit status, the standard output
    and what the terminal got."""
    import pty
    import select
    master, slave = pty.openpty()
    got = []
    with tempfile.TemporaryFile() as out:
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=slave,
                                 env=dict(os.environ, **(env or {})))
        finally:
            os.close(slave)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 0.5)
                if not ready:
                    if p.poll() is not None:
                        break
                    continue
                try:
                    data = os.read(master, 65536)
                except OSError:     # EIO: every holder of the terminal closed it
                    break
                if not data:
                    break
                got.append(data)
            code = p.wait(max(deadline - time.monotonic(), 1))
        finally:
            os.close(master)
        out.seek(0)
        return code, out.read().decode('utf-8', 'replace'), b''.join(got).decode('utf-8', 'replace')


def run_command(argv, expect=0, env=None, timeout=300, cwd=None):
    """Runs a command and checks its exit status: expect is an int, 'fail'
    (a clean failure: 1..125 with a message on stderr, not a crash) or None.

    Output goes to files, not pipes, so that a daemon that keeps them open
    cannot make this wait forever."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                               env=full_env, timeout=timeout, cwd=cwd)
            code = p.returncode
        except subprocess.TimeoutExpired:
            code = 'timeout'
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        r = Result([str(a) for a in argv], code,
                   out.read().decode('utf-8', 'replace'), err.read().decode('utf-8', 'replace'),
                   seconds)
    if code == 'timeout':
        fail(f'timed out after {timeout}s:\n{r.describe()}')
    if expect == 'fail':
        if not (isinstance(code, int) and 1 <= code <= 125):
            fail(f'expected a clean failure (exit status 1..125):\n{r.describe()}')
        if not r.err.strip():
            fail(f'failed without saying why on stderr:\n{r.describe()}')
    elif expect is not None and code != expect:
        fail(f'expected exit status {expect}:\n{r.describe()}')
    return r


# --------------------------------------------------------------------------
# JSON output of cowbox-store: every key the tests read is read here.

SUBVOLUME_KEYS = ('name', 'uuid', 'parent_uuid', 'readonly', 'logical_bytes',
                  'referenced_bytes', 'exclusive_bytes', 'inodes', 'mounted_by')
USAGE_KEYS = ('logical_bytes', 'stored_bytes', 'data_bytes', 'metadata_bytes',
              'pack_file_bytes', 'reclaimable_bytes', 'corruption_events')


def json_subvolume_list(doc):
    """`subvolume list --json`: an array of subvolumes, or an object with a
    "subvolumes" array."""
    if isinstance(doc, dict) and isinstance(doc.get('subvolumes'), list):
        doc = doc['subvolumes']
    if not isinstance(doc, list) or not all(isinstance(x, dict) for x in doc):
        fail(f'subvolume list --json: expected an array of objects, got {doc!r}')
    return [json_subvolume(x) for x in doc]


def json_subvolume(doc):
    """One subvolume (`subvolume show --json`, or an element of the list): an
    object, or an object with a "subvolume" object. Normalizes absent
    values: parent_uuid "" and mounted_by 0."""
    if isinstance(doc, dict) and isinstance(doc.get('subvolume'), dict):
        doc = doc['subvolume']
    if not isinstance(doc, dict):
        fail(f'expected a subvolume object, got {doc!r}')
    missing = [k for k in SUBVOLUME_KEYS if k not in doc]
    if missing:
        fail(f'subvolume object lacks {", ".join(missing)}: {doc!r}')
    out = dict(doc)
    out['parent_uuid'] = doc['parent_uuid'] or ''
    out['mounted_by'] = int(doc['mounted_by'] or 0)
    out['readonly'] = bool(doc['readonly'])
    for k in ('logical_bytes', 'referenced_bytes', 'exclusive_bytes', 'inodes'):
        if not isinstance(doc[k], int) or isinstance(doc[k], bool):
            fail(f'subvolume {doc.get("name")!r}: {k} is not an integer: {doc[k]!r}')
    return out


def json_usage(doc):
    """`usage --json`: an object with the StoreUsage fields (at the top, or
    in a "total" object) and a "subvolumes" array (each with name and the
    space fields). Returns one flat object with "subvolumes"."""
    if not isinstance(doc, dict):
        fail(f'usage --json: expected an object, got {doc!r}')
    if isinstance(doc.get('total'), dict):
        doc = {**doc['total'], **{k: v for k, v in doc.items() if k != 'total'}}
    missing = [k for k in USAGE_KEYS if k not in doc]
    if missing:
        fail(f'usage --json lacks {", ".join(missing)}: {doc!r}')
    for k in USAGE_KEYS:
        if not isinstance(doc[k], int) or isinstance(doc[k], bool):
            fail(f'usage --json: {k} is not an integer: {doc[k]!r}')
    subvolumes = doc.get('subvolumes')
    if not isinstance(subvolumes, list):
        fail(f'usage --json lacks a "subvolumes" array: {doc!r}')
    return doc


def json_usage_subvolume(doc, name):
    """One subvolume's entry in `usage --json` (doc as json_usage() returns
    it, or as the tool printed it)."""
    for s in json_usage(doc)['subvolumes']:
        if isinstance(s, dict) and s.get('name') == name:
            return s
    fail(f'usage --json has no subvolume {name!r}: {doc!r}')


# --------------------------------------------------------------------------
# Mount table and processes


def _unescape_mountinfo(s):
    return re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), s)


def mount_table():
    """Mount points to file system types, from /proc/self/mountinfo."""
    out = {}
    with open('/proc/self/mountinfo', errors='surrogateescape') as f:
        for line in f:
            left, _, right = line.partition(' - ')
            fields = left.split()
            out[_unescape_mountinfo(fields[4])] = right.split()[0] if right else '?'
    return out


def is_mounted(path):
    return path in mount_table()


class DelegatedCgroup:
    """A fresh cgroup of the unified (v2) tree, marked delegated as
    systemd marks one of a unit with Delegate=yes (the trusted.delegate
    attribute), for a process to be started in (enter() before exec).
    It is made at /cowbox/LABEL-delegated.PID: below a cgroup named cowbox,
    as a sandbox's own is, so that a leaf below it looks like one unless
    told apart by more than the name of a parent. Removed with all below
    it by close(), killing what is left there."""

    def __init__(self, mount, label):
        self.mount = mount
        self.name = f'/cowbox/{label}-delegated.{os.getpid()}'
        self.path = mount + self.name
        os.makedirs(self.path)
        os.setxattr(self.path, 'trusted.delegate', b'1')

    def enter(self, below=''):
        with open(os.path.join(self.path, below, 'cgroup.procs'), 'w') as f:
            f.write(str(os.getpid()))

    def procs(self, below=''):
        with open(os.path.join(self.path, below, 'cgroup.procs')) as f:
            return [int(p) for p in f.read().split()]

    def children(self, below=''):
        """The cgroups right below below (none if it is missing)."""
        top = os.path.join(self.path, below)
        return sorted(e for e in os.listdir(top) if os.path.isdir(os.path.join(top, e))) if os.path.isdir(top) else []

    def close(self):
        for top, dirs, _ in sorted(os.walk(self.path), key=lambda w: -w[0].count('/')):
            with contextlib.suppress(OSError):
                with open(os.path.join(top, 'cgroup.kill'), 'w') as f:
                    f.write('1')
            for _ in range(100):
                try:
                    os.rmdir(top)
                    break
                except OSError:
                    time.sleep(0.05)


def delegated_cgroup(label):
    """A DelegatedCgroup, or None (saying why) where there is no v2 tree."""
    mount = next((m for m, fs in mount_table().items() if fs == 'cgroup2'), None)
    if not mount:
        print('SKIP: cgroup v2 delegation: no cgroup v2 tree is mounted', flush=True)
        return None
    return DelegatedCgroup(mount, label)


def process_alive(pid):
    """True if pid runs (a zombie counts as gone)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = data.rpartition(')')[2].split()[0]
    return state not in ('Z', 'X')


def wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if process_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if process_alive(p)]


def row_check(*values):
    """The store's cowbox_check() of a row: XXH3-64 over each value's type,
    length and bytes, as a signed 64-bit integer, as SQLite keeps it."""
    data = bytearray()
    for v in values:
        if isinstance(v, (int, float)):
            data += b'i' + (int(v) & (2**64 - 1)).to_bytes(8, 'little')
        elif isinstance(v, (str, bytes)):
            b = v.encode() if isinstance(v, str) else v
            data += b'b' + len(b).to_bytes(4, 'little') + b
        else:
            data += b'n'
    lib = ctypes.CDLL('libxxhash.so.0')
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h = lib.XXH3_64bits(bytes(data), len(data))
    return h - 2**64 if h >= 2**63 else h


def open_catalog(store_path):
    """The store's catalog, opened as the store opens it: its triggers keep
    the checks of the rows a test changes."""
    db = sqlite3.connect(os.path.join(store_path, 'catalog.db'), timeout=30)
    db.create_function('cowbox_check', -1, row_check, deterministic=True)
    return db


def processes_with_arg(arg, exact=False):
    """Pids (other than this process) whose command line has arg in it (as
    one whole argument if exact)."""
    out = []
    me = os.getpid()
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                argv = f.read().split(b'\0')
        except OSError:
            continue
        a = arg.encode()
        if (a in argv if exact else any(a in x for x in argv)) and process_alive(int(entry)):
            out.append(int(entry))
    return out


def _exe(pid):
    try:
        return os.path.realpath(f'/proc/{pid}/exe')
    except OSError:
        return None


def holds_dev_fuse(pid):
    try:
        for fd in os.listdir(f'/proc/{pid}/fd'):
            with contextlib.suppress(OSError):
                if os.readlink(f'/proc/{pid}/fd/{fd}') == '/dev/fuse':
                    return True
    except OSError:
        pass
    return False


# --------------------------------------------------------------------------
# A temporary store and its mounts


def _make_tmpdir(label):
    base = os.environ.get('COWBOX_TEST_TMPDIR') or '/var/tmp'
    path = os.path.realpath(tempfile.mkdtemp(prefix=f'cowbox-{label}-', dir=base))
    os.chmod(path, 0o755)  # other users reach the mounts inside (allow_other tests)
    return path


class Store:
    """A store in a temporary directory, removed at the end with everything
    mounted from it. Use as a context manager."""

    def __init__(self, label='test', init=True):
        self.label = label
        self.init_store = init
        self.tmp = None
        self.path = None
        self.mounts = []
        self._counter = 0

    def __enter__(self):
        self.tmp = _make_tmpdir(self.label)
        self.path = os.path.join(self.tmp, 'store')
        print(f'store {self.path}', flush=True)
        if self.init_store:
            try:
                self.run('init')
            except BaseException:
                self.cleanup(failed=True)
                raise
        return self

    def __exit__(self, exc_type, exc, tb):
        self.cleanup(failed=exc_type is not None and not issubclass(exc_type, Skip))
        return False

    def cleanup(self, failed=False):
        for m in self.mounts:
            if m.mounted:
                with contextlib.suppress(Exception):
                    m.unmount(force=True)
        # Servers or reapers of this store still running: started by this
        # test, stopped by pid.
        pids = processes_with_arg(self.tmp)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in wait_gone(pids, 10):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mp in mount_table():
            if mp == self.tmp or mp.startswith(self.tmp + '/'):
                subprocess.run(['umount', '-l', mp], capture_output=True)
        if failed and os.environ.get('COWBOX_KEEP_TMP') == '1':
            print(f'kept {self.tmp} for debugging', flush=True)
            return
        shutil.rmtree(self.tmp, onerror=lambda fn, p, e: print(f'warning: cannot remove {p}: {e[1]}'))

    def new_dir(self, label):
        """A new empty directory in the test's temporary directory."""
        self._counter += 1
        path = os.path.join(self.tmp, f'{label}-{self._counter}')
        os.mkdir(path)
        return path

    def run(self, *args, expect=0, json_output=False, timeout=300, env=None):
        argv = [tool(), '--store', self.path] + (['--json'] if json_output else []) + list(args)
        return run_command(argv, expect=expect, timeout=timeout, env=env)

    def json(self, *args, timeout=300):
        return self.run(*args, json_output=True, timeout=timeout).json()

    def create(self, name):
        self.run('subvolume', 'create', name)

    def snapshot(self, source, name, readonly=False):
        self.run('subvolume', 'snapshot', *(['-r'] if readonly else []), source, name)

    def delete(self, name, reap=True):
        self.run('subvolume', 'delete', *([] if reap else ['--no-reap']), name)

    def reap(self):
        self.run('reap', '--wait')

    def list(self):
        return json_subvolume_list(self.json('subvolume', 'list'))

    def names(self):
        return sorted(s['name'] for s in self.list())

    def show(self, name):
        info = json_subvolume(self.json('subvolume', 'show', name))
        check_equal(info['name'], name, f'subvolume show {name}: name')
        return info

    def usage(self):
        return json_usage(self.json('usage'))

    def log(self):
        """What servers and reapers on their own logged, oldest first."""
        text = ''
        for name in ('log.old', 'log'):
            try:
                text += read_file(os.path.join(self.path, name)).decode(errors='replace')
            except FileNotFoundError:
                pass
        return text

    def reaper_lock_holder(self):
        """The pid that holds the store's reaper lock (a reaper, fsck or
        scrub), or None when nobody holds it."""
        try:
            with open(os.path.join(self.path, 'locks', 'reaper.lock'), 'rb') as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    return None
                except BlockingIOError:
                    return int(f.read().strip() or 0) or None
        except (FileNotFoundError, ValueError):
            return None

    def fsck(self, repair=False, expect=0):
        return self.run('fsck', *(['--repair'] if repair else []), expect=expect)

    def mount(self, name, readonly=False, path=None, env=None):
        """A Mount of subvolume name (a context manager); env is added to the
        server's environment."""
        m = Mount(self, name, path or self.new_dir(f'mnt-{name}'), readonly, env)
        self.mounts.append(m)
        return m


class Mount:
    """A subvolume mounted in the background by cowbox-store; unmounted with
    fusermount3 -u when the block ends, even when it ends with an error."""

    def __init__(self, store, name, path, readonly=False, env=None):
        self.store = store
        self.name = name
        self.path = path
        self.readonly = readonly
        self.env = env
        self.mounted = False
        self.pids = []

    def __enter__(self):
        self.mount()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.unmount()
        else:
            try:
                self.unmount(force=True)
            except Exception as e:  # the first error is the one to report
                print(f'warning: unmounting {self.path}: {e}', flush=True)
        return False

    def p(self, *parts):
        return os.path.join(self.path, *parts)

    def mount(self, expect=0):
        """Mounts; with expect='fail' checks that mounting fails and returns
        the Result; with expect=None, either may happen (see self.mounted)."""
        args = ['mount', '--background'] + (['--read-only'] if self.readonly else [])
        r = self.store.run(*args, self.name, self.path, expect=expect, timeout=120, env=self.env)
        if expect is None and r.code != 0:
            return r
        if expect not in (0, None):
            if is_mounted(self.path):
                self.mounted = True
                fail(f'mount was expected to fail but {self.path} is mounted:\n{r.describe()}')
            return r
        fstype = mount_table().get(self.path)
        if fstype is None:
            fail(f'mount --background returned but {self.path} is not mounted yet:\n{r.describe()}')
        self.mounted = True
        if not fstype.startswith('fuse'):
            fail(f'{self.path} is mounted as {fstype}, not FUSE')
        self.pids = [p for p in processes_with_arg(self.path, exact=True) if holds_dev_fuse(p)]
        if len(self.pids) > 1:
            # A mount helper may hold /dev/fuse too: keep the tool's processes.
            exe = os.path.realpath(tool())
            mine = [p for p in self.pids if _exe(p) == exe]
            self.pids = mine or self.pids
        if not self.pids:
            fail(f'no process holding /dev/fuse with {self.path} in its command line')
        return r

    @property
    def pid(self):
        if len(self.pids) != 1:
            fail(f'{len(self.pids)} server processes for {self.path}: {self.pids}')
        return self.pids[0]

    def unmount(self, force=False, timeout=60):
        """Unmounts and waits for the server to exit (by then it has written
        everything and released the subvolume)."""
        if not self.mounted:
            return
        busy = None
        for _ in range(40 if not force else 8):
            r = subprocess.run(['fusermount3', '-u', self.path], capture_output=True, text=True)
            if r.returncode == 0 or not is_mounted(self.path):
                break
            busy = r.stderr.strip()
            time.sleep(0.25)
        else:
            subprocess.run(['fusermount3', '-u', '-z', self.path], capture_output=True)
            if is_mounted(self.path):
                subprocess.run(['umount', '-l', self.path], capture_output=True)
            self.mounted = False
            if not force:
                fail(f'fusermount3 -u {self.path} kept failing ({busy}); unmounted lazily')
        self.mounted = False
        left = wait_gone(self.pids, timeout)
        if left and not force:
            fail(f'server {left} still running {timeout}s after {self.path} was unmounted')

    def kill(self, sig=signal.SIGKILL):
        """Kills the server and cleans up the dead mount, as an operator
        would after a crash."""
        pid = self.pid
        os.kill(pid, sig)
        if wait_gone([pid], 30):
            fail(f'server {pid} still alive 30s after signal {sig}')
        for argv in (['fusermount3', '-u', self.path], ['fusermount3', '-u', '-z', self.path],
                     ['umount', '-l', self.path]):
            if not is_mounted(self.path):
                break
            subprocess.run(argv, capture_output=True)
        if is_mounted(self.path):
            fail(f'cannot clean up the dead mount {self.path}')
        self.mounted = False

    def remount(self):
        self.unmount()
        self.mount()


@contextlib.contextmanager
def temporary_directory(label):
    """A host directory removed at the end (for trees to compare against)."""
    path = _make_tmpdir(label)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
