"""Kernel-enforced confinement, applied by ``runner.py`` inside the sandbox before any untrusted code runs.

``confine`` builds the filesystem view for the ``unshare`` backend (bubblewrap builds the same one itself) and
drops every capability; ``install_seccomp`` stops process creation and the namespace/mount/kernel-interface
calls for good. Stdlib only (ctypes): the sandbox sees the interpreter's standard library and nothing else.
"""

import ctypes
import os
import platform
import struct

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
# A remount inside a user namespace must keep the flags the host mount was locked with, so they are read back
# from statvfs and kept (bubblewrap does the same).
KEEP_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: 8, os.ST_NOATIME: 1024,
              os.ST_NODIRATIME: 2048, os.ST_RELATIME: 1 << 21}
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# syscall numbers: (x86_64, aarch64); None where the architecture has no such call
DENIED = {
    "fork": (57, None), "vfork": (58, None), "execve": (59, 221), "execveat": (322, 281),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268), "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "personality": (135, 92),
    "syslog": (103, 116), "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "quotactl": (179, 60), "lookup_dcookie": (212, 18), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "iopl": (172, None), "ioperm": (173, None),
}
CLONE, CLONE3, PIVOT_ROOT = (56, 220), (435, 435), (155, 41)
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column in the tables, AUDIT_ARCH_*
CLONE_THREAD = 0x00010000
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags: int, data=None) -> None:
    encode = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _column() -> int:
    machine = platform.machine()
    if machine not in ARCHES:
        raise OSError(f"no seccomp syscall table for {machine}")
    return ARCHES[machine][0]


def confine(root: str, binds: list, links: list, covered: list, devices: list, tmpfs_bytes: int) -> None:
    """Turn this process (root of fresh user, mount, pid and network namespaces) into the sandbox.

    A tmpfs root holding read-only binds of what the interpreter needs, an empty read-only tmpfs over each
    ``covered`` directory, symlinks (merged /usr), the device nodes, and a size-capped tmpfs ``/sandbox`` as the
    only writable place; the old root is detached.
    """
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for source, target in binds:
        inside = root + target
        os.makedirs(inside, exist_ok=True)
        _mount(source, inside, None, MS_BIND | MS_REC)
        kept = sum(flag for st, flag in KEEP_FLAGS.items() if os.statvfs(inside).f_flag & st)
        _mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)
    for path in covered:
        _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    for target, path in links:
        os.symlink(target, root + path)
    os.makedirs(root + "/dev")
    for device in devices:
        open(root + device, "w").close()
        _mount(device, root + device, None, MS_BIND)
    os.makedirs(root + "/sandbox")
    _mount("tmpfs", root + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={tmpfs_bytes}")
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path back to the host.
    os.chdir(root)
    _check(libc.syscall(PIVOT_ROOT[_column()], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/sandbox")
    _drop_capabilities()


def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets: namespace root becomes powerless."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: past the last cap
            _check(-1, "drop capability bounding set")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty __user_cap_data_struct
    _check(libc.capset(header, data), "capset")


def seccomp_program() -> bytes:
    """Classic BPF: wrong architecture or x32 → EPERM; the DENIED calls → EPERM; clone3 → ENOSYS (its flags sit
    behind a pointer the filter cannot read, so libc falls back to clone); clone only with CLONE_THREAD."""
    column = _column()
    arch = ARCHES[platform.machine()][1]
    ops = [("ld", 4, None, None), ("jeq", arch, None, "deny"), ("ld", 0, None, None)]
    if platform.machine() == "x86_64":
        ops.append(("jge", X32_SYSCALL_BIT, "deny", None))
    ops += [("jeq", numbers[column], "deny", None) for numbers in DENIED.values() if numbers[column] is not None]
    ops += [("jeq", CLONE3[column], "nosys", None), ("jeq", CLONE[column], None, "allow"),
            ("ld", 16, None, None), ("jset", CLONE_THREAD, "allow", "deny")]  # args[0], low word
    returns = {"allow": RET_ALLOW, "deny": RET_ERRNO | EPERM, "nosys": RET_ERRNO | ENOSYS}
    where = {label: len(ops) + i for i, label in enumerate(returns)}
    codes = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "jset": 0x45}  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K
    out = b""
    for i, (op, k, true, false) in enumerate(ops):
        jt, jf = (0 if label is None else where[label] - i - 1 for label in (true, false))
        out += struct.pack("=HBBI", codes[op], jt, jf, k)
    return out + b"".join(struct.pack("=HBBI", 0x06, 0, 0, value) for value in returns.values())  # BPF_RET|K


def install_seccomp() -> None:
    program = seccomp_program()
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buffer))  # struct sock_fprog
    fprog_buffer = ctypes.create_string_buffer(fprog)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog_buffer), 0, 0), "seccomp")
