"""The bwrap launcher for root: bwrap and the program run as uid/gid 65534 outside the sandbox too.

Run as ``python -I -c <this file> <spec JSON>`` (:func:`validate.sandbox.program`) by the engine when it is root.
A forked child enters a new user and mount namespace; the parent maps uid/gid ``spec["uid"]`` to itself in the
child's namespace; in the child's private mount namespace each directory blocking the interpreter is covered by
an empty tmpfs and the interpreter's directories bound back read-only; then the child becomes that uid and
execs ``spec["argv"]`` (bwrap). The launcher's exit status is the child's (128 + the signal when killed, as bwrap
reports it); 125 with a line on stderr when a step fails.

Self-contained (stdlib only, no ``from __future__``): the project cannot be imported on the base interpreter.
"""
import ctypes
import json
import os
import sys

RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 1 << 14, 1 << 18
ST_KEEP = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # statvfs flag -> mount flag a remount keeps
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000

libc = None  # loaded by main()


def fail(why):
    """Exit 125 (before the exec), saying why on stderr."""
    os.write(2, ("sandbox launcher: %s\n" % why).encode())
    os._exit(125)


def check(rc, what):
    """Raise OSError naming ``what`` and errno when a libc call returned non-zero."""
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(src, target, fstype, flags, data=None):
    """mount(2) through libc; OSError when it fails."""
    b = lambda s: None if s is None else s.encode()
    check(libc.mount(b(src), b(target), b(fstype), flags, b(data)), "mount " + target)


def id_map(uid):
    """The uid_map / gid_map line mapping ``uid`` inside to ``uid`` outside, one id."""
    return "%d %d 1\n" % (uid, uid)


def child(spec, to_child_r, to_parent_w):
    """In the forked child: new namespaces, wait for the id maps, drop to the uid, hide, exec bwrap."""
    uid = spec["uid"]
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    # still the engine's file-system ids: open what 65534 cannot reach, in the new mount namespace
    hide = [(d, [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in paths]) for d, paths in spec["hide"]]
    os.write(to_parent_w, b"1")
    os.close(to_parent_w)
    if os.read(to_child_r, 1) != b"1":
        fail("the user namespace's id maps were not written")
    os.close(to_child_r)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # the namespace's uid 0 is unmapped: its capabilities stay, until exec
    mount(None, "/", None, REC | PRIVATE)
    for d, binds in hide:
        mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "mode=0755,size=64k")
        for p, fd in binds:
            os.makedirs(p, exist_ok=True)
            keep = sum(m for s, m in ST_KEEP.items() if os.statvfs("/proc/self/fd/%d" % fd).f_flag & s)
            mount("/proc/self/fd/%d" % fd, p, None, BIND)
            mount(None, p, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | keep)
            os.close(fd)
        mount(None, d, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
    os.execv(spec["argv"][0], spec["argv"])


def main(argv):
    """Launch ``argv[1]``'s spec (``uid``, ``hide``, ``argv``, ``close``); exit with the child's status."""
    global libc
    spec = json.loads(argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            child(spec, to_child_r, to_parent_w)
        except BaseException as e:
            fail("%s: %s" % (type(e).__name__, e))
    os.close(to_child_r)
    os.close(to_parent_w)
    for fd in spec["close"]:  # the call and result pipes are the sandbox's, not the launcher's
        os.close(fd)
    if os.read(to_parent_r, 1) == b"1":
        try:
            for name in ("uid_map", "gid_map"):
                with open("/proc/%d/%s" % (pid, name), "w") as f:
                    f.write(id_map(spec["uid"]))
            os.write(to_child_w, b"1")
        except OSError as e:
            os.write(2, ("sandbox launcher: writing the id maps failed: %s\n" % e).encode())
    os.close(to_child_w)
    _, status = os.waitpid(pid, 0)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv)
