# SPDX-License-Identifier: LGPL-2.1-or-later
"""What the benchmarks in bench/ share: the generated source tree, timing and
formatting, processes and mounts, and cowbox-store.

The tree generator makes a tree shaped like a source checkout: about 30 files
a directory, directories nested up to 4 levels, log-normal file sizes with a
median of 4 KiB, and content cut from generated C-like source text that
compresses about 4x. The same (number of files, seed) always gives the same
tree, byte for byte.

Python 3 standard library only. The benchmarks import it from their own
directory; see bench/README.md.
"""

import argparse
import json
import math
import os
import random
import shlex
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time

EXIT_SKIP = 77

FILES_PER_DIR = 30          # mean files per directory
MAX_DEPTH = 4               # directories nest 1..4 levels below the root
MEDIAN_FILE_SIZE = 4096     # bytes; sizes are log-normal around this median
SIZE_SIGMA = 1.2            # of the log of the size; mean is about 2x the median
POOL_SIZE = 8 << 20         # bytes of generated source text that files are cut from
MAX_FILE_SIZE = POOL_SIZE

VERIFY_SAMPLE = 64          # files whose content is compared after a snapshot
RELEASE_TIMEOUT = 600.0     # seconds to wait for a FUSE server to let go of a subvolume
MOUNT_TIMEOUT = 60.0
MOUNT_POLL = 0.0002         # seconds between looks at a mount point that is not there yet


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------
# Formatting

def fmt_time(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 10e-3:
        return f"{s * 1e3:.2f} ms"
    if s < 100e-3:
        return f"{s * 1e3:.1f} ms"
    if s < 1.0:
        return f"{s * 1e3:.0f} ms"
    if s < 10.0:
        return f"{s:.2f} s"
    if s < 100.0:
        return f"{s:.1f} s"
    return f"{s:.0f} s"


def fmt_bytes(n):
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_count(n):
    return f"{n:,}"


def fmt_factor(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def ratio_words(cowbox, other):
    """'770x faster' or '2.1x slower', from two medians."""
    if not cowbox or not other:
        return "-"
    r = other / cowbox
    if r >= 1:
        return f"{fmt_factor(r)} faster"
    return f"{fmt_factor(1 / r)} slower"


def judge_at_most(value, limit):
    """'met', or 'MISSED by X' where X is how many times value must shrink."""
    if value is None:
        return "-"
    return "met" if value <= limit else f"MISSED by {value / limit:.2f}x"


def judge_at_least(value, limit):
    """'met', or 'MISSED by X' where X is how many times value must grow."""
    if not value:
        return "-"
    return "met" if value >= limit else f"MISSED by {limit / value:.2f}x"


def print_targets(head, rows):
    """An aligned table whose rows end with their result ('met', 'MISSED by
    X', ...), then one line that counts the targets met and names those
    missed."""
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    out(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    out("-+-".join("-" * w for w in widths))
    for r in rows:
        out(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    judged = [r for r in rows if r[-1] == "met" or r[-1].startswith("MISSED")]
    missed = [r[0] for r in judged if r[-1].startswith("MISSED")]
    out(f"{len(judged) - len(missed)} targets met, {len(missed)} missed" +
        (": " + "; ".join(missed) if missed else ""))


def median(xs):
    return statistics.median(xs) if xs else None


def worst(xs):
    return max(xs) if xs else None


def out(*a):
    print(*a, flush=True)


def warn(msg):
    print(f"warning: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Processes and mounts

def run(argv, check=True):
    """Runs argv and returns (seconds, CompletedProcess)."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if check and p.returncode != 0:
        msg = p.stderr.decode(errors="replace").strip() or p.stdout.decode(errors="replace").strip()
        raise BenchError(f"{shlex.join(map(str, argv))} failed (exit status {p.returncode})"
                         + (f": {msg}" if msg else ""))
    return t, p


def timed(argv):
    return run(argv)[0]


def process_start(tool, runs):
    """The start cost of a cowbox-store process (--version) and of /bin/true,
    runs times each after one that warms the caches: every time measured of a
    cowbox-store command includes the first. Prints it; returns the samples."""
    true = shutil.which("true") or "/bin/true"
    startup = {"version": [], "true": []}
    for _ in range(runs + 1):
        startup["version"].append(timed([tool, "--version"]))
        startup["true"].append(timed([true]))
    del startup["version"][0], startup["true"][0]
    out(f"process   cowbox-store --version: median {fmt_time(median(startup['version']))}, "
        f"worst {fmt_time(worst(startup['version']))}; /bin/true {fmt_time(median(startup['true']))}")
    return startup


def unescape_mountinfo(s):
    out_ = []
    i = 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out_.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out_.append(s[i])
            i += 1
    return "".join(out_)


def mount_points():
    """Mount points and their file system types, from /proc/self/mountinfo."""
    points = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            try:
                sep = fields.index("-")
            except ValueError:
                continue
            points[unescape_mountinfo(fields[4])] = (fields[sep + 1], unescape_mountinfo(fields[sep + 2]))
    return points


def is_mounted(path):
    return os.path.realpath(path) in mount_points()


def fs_of(path):
    """(type, source, mount point) of the file system that holds path."""
    path = os.path.realpath(path)
    best = None
    for mp, (fstype, source) in mount_points().items():
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) > len(best[2]):
                best = (fstype, source, mp)
    return best or ("?", "?", "/")


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fusermount_unmount(mnt, lazy=False):
    argv = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [mnt]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)


def unmount_any(mnt, lazy=False):
    """Unmounts a FUSE mount with fusermount3, any other (overlayfs, a loop
    file's btrfs) with umount."""
    fstype = mount_points().get(os.path.realpath(mnt), ("", ""))[0]
    if fstype.startswith("fuse"):
        return fusermount_unmount(mnt, lazy)
    argv = ["umount"] + (["-l"] if lazy else []) + [mnt]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)


class Cleanup:
    """Mounts and scratch directories to undo on any exit, Ctrl-C included.
    FUSE mounts are undone with fusermount3 -u, others with umount."""

    def __init__(self):
        self.mounts = []
        self.paths = []
        self.keep = False

    def run(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for mnt in reversed(self.mounts):
            if not is_mounted(mnt):
                continue
            unmount_any(mnt)
            if is_mounted(mnt):
                unmount_any(mnt, lazy=True)
            if is_mounted(mnt):
                warn(f"could not unmount {mnt}")
        self.mounts.clear()
        for path in reversed(self.paths):
            if not os.path.lexists(path):
                continue
            if self.keep:
                out(f"kept {path}")
                continue
            p = subprocess.run(["rm", "-rf", "--one-file-system", "--", path],
                               stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if p.returncode != 0:
                warn(f"could not remove {path}: {p.stderr.decode(errors='replace').strip()}")
        self.paths.clear()


CLEANUP = Cleanup()


def remove_tree(path):
    if os.path.lexists(path):
        run(["rm", "-rf", "--one-file-system", "--", path])


# ---------------------------------------------------------------------------
# cowbox-store

def bfs_key(doc, key):
    """The value of key in the shallowest object that has it (lists are not entered:
    store-wide totals, not a subvolume's)."""
    queue = [doc]
    while queue:
        nxt = []
        for obj in queue:
            if isinstance(obj, dict):
                if key in obj:
                    return obj[key]
                nxt.extend(v for v in obj.values() if isinstance(v, dict))
        queue = nxt
    return None


def find_named(doc, name):
    """The object with "name": name anywhere in doc."""
    if isinstance(doc, dict):
        if doc.get("name") == name:
            return doc
        children = doc.values()
    elif isinstance(doc, list):
        children = doc
    else:
        return None
    for c in children:
        found = find_named(c, name)
        if found is not None:
            return found
    return None


class CowboxStore:
    def __init__(self, tool, path):
        self.tool = tool
        self.path = path
        self.json_first = True      # where --json goes: before the command, or after it

    def argv(self, *args):
        return [self.tool, "--store", self.path] + list(args)

    def run(self, *args):
        return run(self.argv(*args))[1]

    def timed(self, *args):
        return timed(self.argv(*args))

    def query(self, *args):
        """Runs a command with --json and returns the parsed document."""
        orders = [True, False] if self.json_first else [False, True]
        last = None
        for first in orders:
            argv = self.argv("--json", *args) if first else self.argv(*args, "--json")
            _, p = run(argv, check=False)
            if p.returncode == 0:
                try:
                    doc = json.loads(p.stdout)
                except ValueError as e:
                    last = BenchError(f"{shlex.join(argv)} printed no JSON: {e}")
                    continue
                self.json_first = first
                return doc
            last = BenchError(f"{shlex.join(argv)} failed (exit status {p.returncode}): "
                              + p.stderr.decode(errors="replace").strip())
        raise last

    def usage(self):
        doc = self.query("usage")
        return {k: bfs_key(doc, k) for k in
                ("logical_bytes", "stored_bytes", "data_bytes", "metadata_bytes",
                 "pack_file_bytes", "reclaimable_bytes", "deleted_subvolumes", "layers")}

    def subvolume(self, name):
        return find_named(self.query("subvolume", "list"), name)

    def mount(self, name, mnt):
        """mount --background; returns once the mount point is there."""
        argv = self.argv("mount", "--background", name, mnt)
        # Output to a file, not a pipe: a server that keeps an inherited pipe open
        # would make us wait for it to exit.
        with tempfile.TemporaryFile() as log:
            CLEANUP.mounts.append(mnt)
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            if p.returncode != 0:
                log.seek(0)
                raise BenchError(f"{shlex.join(argv)} failed (exit status {p.returncode}): "
                                 + log.read().decode(errors="replace").strip())
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not is_mounted(mnt):
            if time.monotonic() > deadline:
                raise BenchError(f"{mnt} is not mounted {MOUNT_TIMEOUT:.0f} s after {shlex.join(argv)}")
            time.sleep(0.005)

    def unmount(self, name, mnt):
        """fusermount3 -u, then waits until the server has let go of the subvolume.
        Returns (seconds of fusermount3, seconds until released)."""
        t0 = time.perf_counter()
        for attempt in range(50):
            p = fusermount_unmount(mnt)
            if p.returncode == 0 or not is_mounted(mnt):
                break
            time.sleep(0.1)
        else:
            raise BenchError(f"fusermount3 -u {mnt} failed: {p.stderr.decode(errors='replace').strip()}")
        t1 = time.perf_counter()
        if mnt in CLEANUP.mounts:
            CLEANUP.mounts.remove(mnt)
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while True:
            sv = self.subvolume(name)
            pid = sv.get("mounted_by") if isinstance(sv, dict) else None
            if not pid or (isinstance(pid, int) and not os.path.exists(f"/proc/{pid}")):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"subvolume {name} is still held by pid {pid} "
                                 f"{RELEASE_TIMEOUT:.0f} s after unmounting it")
            time.sleep(0.005)
        return t1 - t0, time.perf_counter() - t1


# ---------------------------------------------------------------------------
# The generated tree

TOP_DIRS = ["src", "lib", "include", "drivers", "tools", "tests", "docs", "net", "fs",
            "kernel", "arch", "scripts", "crypto", "sound", "block", "mm", "ipc", "init",
            "security", "virt", "samples", "firmware", "contrib", "third_party"]

DIR_WORDS = ["core", "util", "common", "io", "mem", "net", "proto", "codec", "cache", "sched",
             "store", "layer", "block", "chunk", "pack", "index", "db", "fuse", "vfs", "api",
             "cli", "daemon", "runtime", "image", "stream", "sync", "crypto", "hash", "zstd",
             "json", "log", "test", "bench", "fixtures", "data", "parser", "lexer", "ast", "ir",
             "codegen", "opt", "x86", "arm64", "riscv", "pci", "usb", "gpu", "audio", "video",
             "input", "power", "clk", "irq", "dma", "spi", "i2c", "gpio", "uart", "eth", "wifi",
             "bt", "nfs", "ext4", "btrfs", "xfs", "ovl", "cgroup", "ns", "seccomp", "bpf"]

TYPES = ["int", "unsigned", "long", "char", "void", "bool", "size_t", "ssize_t", "uint8_t",
         "uint16_t", "uint32_t", "uint64_t", "int64_t", "off_t", "pid_t", "struct node",
         "struct layer", "struct block", "const char", "Store", "Layer", "Chunk", "Entry"]

IDENTS = ["buf", "len", "ret", "fd", "offset", "node", "entry", "inode", "layer", "block",
          "chunk", "pack", "index", "digest", "name", "path", "flags", "mode", "size", "count",
          "head", "tail", "next", "prev", "list", "table", "key", "value", "hash", "seed",
          "state", "ctx", "req", "reply", "err", "data", "ptr", "end", "begin", "pos", "cursor",
          "stream", "frame", "header", "payload", "limit", "quota", "parent", "child", "root",
          "dir", "file", "link", "xattr", "attr", "stat", "time", "usec", "ns", "id", "uuid",
          "refs", "users", "owner", "group", "perm", "lock", "mutex", "cond", "thread", "queue",
          "job", "task", "event", "loop", "timer", "signal", "mask", "bit", "word", "byte",
          "page", "extent", "range", "start", "stop", "open", "close", "read", "write", "sync",
          "flush", "alloc", "free", "init", "done", "lookup", "insert", "remove", "resize",
          "parse", "format", "encode", "decode", "verify", "compress", "split", "merge"]

WORDS = ["the", "a", "of", "to", "is", "and", "in", "if", "it", "for", "not", "we", "on",
         "this", "that", "be", "when", "must", "may", "never", "always", "only", "returns",
         "caller", "holds", "lock", "free", "buffer", "block", "layer", "entry", "after",
         "before", "error", "fails", "keeps", "reference", "count", "zero", "negative", "errno",
         "on", "success", "see", "below", "above", "note", "XXX", "TODO", "FIXME", "fast",
         "path", "slow", "retry", "again", "until", "done", "empty", "full", "size", "bytes"]

OPS = ["==", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "&", "|", "<<", ">>", "&&", "||"]

EXTENSIONS = [(".c", 40), (".h", 30), (".py", 6), (".sh", 3), (".txt", 5), (".md", 4),
              (".S", 2), (".json", 3), (".build", 2), (".rs", 5)]


def make_pool(size, seed):
    """size bytes of text that looks (and compresses) like C source."""
    rng = random.Random(seed)
    ch = rng.choice
    ri = rng.randrange
    lines = []
    total = 0
    depth = 0
    while total < size:
        k = ri(100)
        ind = "        " * depth
        if depth == 0:
            if k < 15:
                line = f"#include <{ch(IDENTS)}/{ch(IDENTS)}.h>"
            elif k < 25:
                line = f"#define {ch(IDENTS).upper()}_{ch(IDENTS).upper()} {ri(4096)}"
            elif k < 40:
                line = "/* " + " ".join(ch(WORDS) for _ in range(ri(3, 14))) + " */"
            elif k < 50:
                line = ""
            else:
                line = (f"static {ch(TYPES)} {ch(IDENTS)}_{ch(IDENTS)}({ch(TYPES)} *{ch(IDENTS)}, "
                        f"{ch(TYPES)} {ch(IDENTS)}) {{")
                depth = 1
        elif k < 20:
            line = f"{ind}{ch(TYPES)} {ch(IDENTS)} = {ch(IDENTS)}_{ch(IDENTS)}({ch(IDENTS)}, {ri(256)});"
        elif k < 30 and depth < 4:
            line = f"{ind}if ({ch(IDENTS)} {ch(OPS)} {ri(64)}) {{"
            depth += 1
        elif k < 36 and depth < 4:
            v = ch(IDENTS)
            line = f"{ind}for (size_t {v} = 0; {v} < {ch(IDENTS)}->{ch(IDENTS)}; {v}++) {{"
            depth += 1
        elif k < 52:
            line = f"{ind}{ch(IDENTS)}->{ch(IDENTS)} = {ch(IDENTS)} {ch(OPS)} {ch(IDENTS)};"
        elif k < 62:
            line = (f"{ind}r = {ch(IDENTS)}_{ch(IDENTS)}({ch(IDENTS)}, &{ch(IDENTS)});\n"
                    f"{ind}if (r < 0)\n{ind}        return r;")
        elif k < 70:
            line = ind + "/* " + " ".join(ch(WORDS) for _ in range(ri(3, 10))) + " */"
        elif k < 75 and depth == 1:
            line = f"{ind}return {ch(IDENTS)};\n}}\n"
            depth = 0
        elif k < 88 and depth > 1:
            depth -= 1
            line = "        " * depth + "}"
        else:
            line = f"{ind}{ch(IDENTS)}_{ch(IDENTS)}({ch(IDENTS)}, {ch(IDENTS)}, {ri(1 << 16):#x});"
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode("ascii")[:size]


class Tree:
    """The plan of a tree of n files: directories, then files with sizes and modes."""

    def __init__(self, n, seed):
        self.n = n
        rng = random.Random(f"cowbox-bench-tree-{seed}-{n}")
        ndirs = max(1, round(n / FILES_PER_DIR))
        n_top = max(1, min(len(TOP_DIRS), round(ndirs ** (1 / 3))))
        self.dirs = []          # relative paths, parents before children
        depth = {}
        names = {"": set()}
        eligible = []           # directories that may still have subdirectories
        for name in TOP_DIRS[:n_top]:
            self.dirs.append(name)
            depth[name] = 1
            names[name] = set()
            eligible.append(name)
        while len(self.dirs) < ndirs:
            parent = eligible[rng.randrange(len(eligible))]
            base = rng.choice(DIR_WORDS)
            name, i = base, 1
            while name in names[parent]:
                i += 1
                name = f"{base}{i}"
            names[parent].add(name)
            rel = f"{parent}/{name}"
            self.dirs.append(rel)
            depth[rel] = depth[parent] + 1
            names[rel] = set()
            if depth[rel] < MAX_DEPTH:
                eligible.append(rel)
        self.depths = {}
        for d in self.dirs:
            self.depths[depth[d]] = self.depths.get(depth[d], 0) + 1

        exts = [e for e, _ in EXTENSIONS]
        weights = [w for _, w in EXTENSIONS]
        mu = math.log(MEDIAN_FILE_SIZE)
        self.files = []         # (relative path, size, mode)
        for _ in range(n):
            d = self.dirs[rng.randrange(len(self.dirs))]
            ext = rng.choices(exts, weights)[0]
            base = f"{rng.choice(IDENTS)}_{rng.choice(IDENTS)}"
            name, i = base + ext, 1
            while name in names[d]:
                i += 1
                name = f"{base}{i}{ext}"
            names[d].add(name)
            size = min(MAX_FILE_SIZE, int(rng.lognormvariate(mu, SIZE_SIGMA)))
            mode = 0o755 if ext in (".sh", ".py") and rng.random() < 0.5 else 0o644
            self.files.append((f"{d}/{name}", size, mode, rng.randrange(POOL_SIZE)))
        self.bytes = sum(f[1] for f in self.files)
        # What it takes on a file system with 4 KiB blocks.
        self.disk_bytes = sum((f[1] + 4095) // 4096 * 4096 for f in self.files) + 4096 * (ndirs + 1)

    def write(self, root, pool):
        doubled = pool + pool
        os.mkdir(root, 0o755)
        for d in self.dirs:
            os.mkdir(os.path.join(root, d), 0o755)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        text = memoryview(doubled)
        for rel, size, mode, offset in self.files:
            fd = os.open(os.path.join(root, rel), flags, mode)
            try:
                view = text[offset:offset + size]
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)


def describe_tree(root):
    """{relative path: (type, size, mode)} of everything below root."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
            result[os.path.relpath(path, root)] = (kind, st.st_size if kind == "f" else 0,
                                                   st.st_mode & 0o7777)
    return result


def verify_copy(tree, copy, seed):
    """Raises unless copy holds the same tree: names, types, sizes, modes, and the
    bytes of a sample of files."""
    a = describe_tree(tree)
    b = describe_tree(copy)
    if a != b:
        missing = sorted(set(a) - set(b))
        extra = sorted(set(b) - set(a))
        differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if extra:
            parts.append(f"{len(extra)} unexpected (first: {extra[0]})")
        if differ:
            parts.append(f"{len(differ)} differ (first: {differ[0]}: {a[differ[0]]} vs {b[differ[0]]})")
        raise BenchError(f"the snapshot does not match the tree: {'; '.join(parts)}")
    files = sorted(k for k, v in a.items() if v[0] == "f")
    rng = random.Random(seed)
    for rel in rng.sample(files, min(VERIFY_SAMPLE, len(files))):
        with open(os.path.join(tree, rel), "rb") as f1, open(os.path.join(copy, rel), "rb") as f2:
            if f1.read() != f2.read():
                raise BenchError(f"the snapshot's {rel} differs from the tree's")
    return len(a)


# ---------------------------------------------------------------------------
# Caches, mounts and timed processes


def drop_caches():
    """Writes back everything, then drops the page cache, dentries and inodes."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def wait_mount_answers(mnt, parent_dev, timeout=60.0):
    """Until stat of mnt gives another device than its parent's."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.stat(mnt).st_dev != parent_dev:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{mnt} does not answer {timeout:.0f} s after mounting it")
        time.sleep(MOUNT_POLL)


def mount_timed(store, name, mnt):
    """cowbox-store mount --background NAME MNT until stat of MNT answers; returns seconds."""
    argv = store.argv("mount", "--background", name, mnt)
    parent = os.stat(os.path.dirname(os.path.realpath(mnt))).st_dev
    with tempfile.TemporaryFile() as log:
        CLEANUP.mounts.append(mnt)
        t0 = time.perf_counter()
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        if p.returncode != 0:
            log.seek(0)
            raise BenchError(f"{shlex.join(argv)} failed (exit status {p.returncode}): "
                             + log.read().decode(errors="replace").strip())
        wait_mount_answers(mnt, parent)
        return time.perf_counter() - t0


def time_argv(argv, cwd=None, env=None):
    """Seconds of one process, from start to exit; raises if it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        raise BenchError(f"{shlex.join(map(str, argv))} failed (exit status {p.returncode})"
                         + (f": {p.stderr.decode(errors='replace').strip()[-2000:]}"
                            if p.stderr.strip() else ""))
    return t


def store_disk_bytes(path):
    """What a store's files take on the host, less its reserve file (free
    space held back for cleaning up a full disk, not data)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames:
            if dirpath == path and name == 'reserve':
                continue
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


# ---------------------------------------------------------------------------
# Arguments and the command line


def resolve_tool(arg):
    candidates = []
    if arg:
        candidates.append(arg)
    elif os.environ.get("COWBOX_STORE_TOOL"):
        candidates.append(os.environ["COWBOX_STORE_TOOL"])
    else:
        here = os.path.dirname(os.path.realpath(__file__))
        candidates.append(os.path.join(here, "..", "build", "cli", "cowbox-store"))
        found = shutil.which("cowbox-store")
        if found:
            candidates.append(found)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
        if os.sep not in c and shutil.which(c):
            return os.path.realpath(shutil.which(c))
    return None


def find_helper(name, arg, env, tool):
    """A helper program built with the project (bench/NAME of the build
    directory): arg if given, else $env, else bench/NAME next to the
    tool's build directory. Its real path, or None."""
    if arg:
        candidates = [arg]
    elif os.environ.get(env):
        candidates = [os.environ[env]]
    else:
        candidates = [os.path.join(os.path.dirname(tool), "..", "bench", name)]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
    return None


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return v


def on_signal(signum, frame):
    raise SystemExit(128 + signum)


def missing_requirement(prog, why_root, programs=(("fusermount3", "fuse3"),)):
    """Why a benchmark cannot run here, or None: it needs /dev/fuse, root
    (why_root says what for) and the programs, each with its Debian
    package."""
    if not os.path.exists("/dev/fuse"):
        return ("/dev/fuse is missing, so no FUSE mount can be made here "
                "(load the fuse module, or give the container the device)")
    if os.geteuid() != 0:
        return f"this benchmark {why_root}, and must run as root: sudo bench/{prog} --tool build/cli/cowbox-store"
    for name, package in programs:
        if not shutil.which(name):
            return f"{name} is missing (Debian package {package})"
    return None


def bench_main(prog, args, body):
    """What every benchmark's main does around its work: finds the tool
    (--tool) and the place for the scratch directory (--dir), turns SIGTERM
    and SIGHUP into a clean stop, and undoes its mounts and removes its
    scratch directory at the end, also after an error or Ctrl-C (unless
    --keep). body(tool, parent) does the work and returns the exit status
    (None: 0). Returns the exit status: 1 when a step failed, 2 for bad
    usage, 130 when interrupted."""
    tool = resolve_tool(args.tool)
    if tool is None:
        print(f"{prog}: cowbox-store not found: build it (meson setup build && ninja -C build) "
              "and pass --tool build/cli/cowbox-store, or set COWBOX_STORE_TOOL", file=sys.stderr)
        return 2
    parent = os.path.realpath(args.dir or os.getcwd())
    if not os.path.isdir(parent):
        print(f"{prog}: --dir {args.dir}: not a directory", file=sys.stderr)
        return 2

    os.umask(0o022)     # the trees' modes are 644, and 755 for directories
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    CLEANUP.keep = args.keep
    try:
        return body(tool, parent) or 0
    except BenchError as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; cleaning up", file=sys.stderr, flush=True)
        return 130
    except SystemExit as e:
        print(f"{prog}: stopped by a signal; cleaning up", file=sys.stderr, flush=True)
        return e.code if isinstance(e.code, int) else 1
    finally:
        CLEANUP.run()
