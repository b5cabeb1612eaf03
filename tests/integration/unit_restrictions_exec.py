"""Run a command under an emulation of gpu-bridge.service's main restrictions (test helper).

    python3 unit_restrictions_exec.py --families AF_UNIX,AF_INET,AF_INET6 --ro / --ro DIR -- CMD...

Must run as root inside a private mount namespace (``unshare -m --propagation private``).
It remounts each ``--ro`` path read-only (ProtectSystem=strict), sets no_new_privs
(NoNewPrivileges=yes) and installs a seccomp filter that, like systemd's, fails socket(2) of
any other address family with EAFNOSUPPORT (RestrictAddressFamilies=) and W+X mappings with
EPERM (MemoryDenyWriteExecute=yes); then it execs CMD. x86_64 only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import struct
import subprocess
import sys

AUDIT_ARCH_X86_64 = 0xC000003E
NR_MMAP, NR_MPROTECT, NR_SOCKET, NR_PKEY_MPROTECT = 9, 10, 41, 329
PROT_WRITE, PROT_EXEC = 0x2, 0x4
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
EAFNOSUPPORT, EPERM = 97, 1
LD_ABS, JEQ_K, JSET_K, RET_K, ALU_AND_K = 0x20, 0x15, 0x45, 0x06, 0x54
OFF_NR, OFF_ARCH, OFF_ARG0, OFF_ARG2 = 0, 4, 16, 32


def program(families: list[int]) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp program, assembled with symbolic jump targets."""
    code: list[tuple] = []
    code += [("ld", OFF_ARCH), ("jeq", AUDIT_ARCH_X86_64, None, "allow")]
    code += [("ld", OFF_NR)]
    code += [("jeq", NR_SOCKET, "socket", None)]
    code += [("jeq", NR_MMAP, "mmap", None)]
    code += [("jeq", NR_MPROTECT, "mprotect", None)]
    code += [("jeq", NR_PKEY_MPROTECT, "mprotect", "allow")]
    code += [("label", "socket"), ("ld", OFF_ARG0)]
    code += [("jeq", fam, "allow", None) for fam in families]
    code += [("ret", RET_ERRNO | EAFNOSUPPORT)]
    code += [("label", "mmap"), ("ld", OFF_ARG2), ("and", PROT_WRITE | PROT_EXEC),
             ("jeq", PROT_WRITE | PROT_EXEC, "deny", "allow")]
    code += [("label", "mprotect"), ("ld", OFF_ARG2), ("jset", PROT_EXEC, "deny", "allow")]
    code += [("label", "deny"), ("ret", RET_ERRNO | EPERM)]
    code += [("label", "allow"), ("ret", RET_ALLOW)]
    labels: dict[str, int] = {}
    pos = 0
    for ins in code:
        if ins[0] == "label":
            labels[ins[1]] = pos
        else:
            pos += 1
    out: list[tuple[int, int, int, int]] = []
    for ins in code:
        if ins[0] == "label":
            continue
        here = len(out)

        def rel(target: str | None, here: int = here) -> int:
            return 0 if target is None else labels[target] - here - 1

        op = ins[0]
        if op == "ld":
            out.append((LD_ABS, 0, 0, ins[1]))
        elif op == "and":
            out.append((ALU_AND_K, 0, 0, ins[1]))
        elif op == "ret":
            out.append((RET_K, 0, 0, ins[1]))
        else:
            out.append((JEQ_K if op == "jeq" else JSET_K, rel(ins[2]), rel(ins[3]), ins[1]))
    return out


def install(families: list[int]) -> None:
    prog = program(families)
    filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filt)))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", required=True)
    ap.add_argument("--ro", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    for path in args.ro:
        if path != "/":
            subprocess.run(["mount", "--bind", path, path], check=True, timeout=10)
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True, timeout=10)
    install([int(getattr(socket, f)) for f in args.families.split(",")])
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main())
