#!/usr/bin/env python3
"""Checks CUDA binaries for a ptxas 13.0 miscompile of the decode attention kernel: LDGSTS (cp.async)
instructions that address uniform registers no instruction of the kernel writes. Such a kernel stops
with "an illegal instruction was encountered" at the copy. Seen when the segment merge was moved out
of the attention loop (docs/BENCHMARKS.md, CUDA decode attention, version 12). Needs cuobjdump (the
GPU machine has it).

  python3 tools/check_ldgsts_registers.py build-cuda/tests/test_backend_cuda [more binaries or .o]

Prints one line per binary, "ok" or the kernels (head_dim/group) and registers at fault; exits 1 if
any binary is at fault.
"""
import re
import subprocess
import sys


def instructions(function_sass):
    return [re.sub(r"\s+", " ", line.split("*/", 1)[1].split("/*")[0]).strip()
            for line in function_sass.split("\n")
            if line.strip().startswith("/*") and "*/" in line]


def unwritten_copy_registers(function_sass):
    written, read_by_copies = set(), set()
    for ins in instructions(function_sass):
        if ins.startswith("LDGSTS"):
            read_by_copies |= set(re.findall(r"UR\d+", ins))
            continue
        m = re.match(r"(@!?U?P\w+ )?(\S+) (UR\d+)", ins)
        if m:  # the first operand is the destination
            written.add(m.group(3))
            if ".64" in m.group(2):
                written.add("UR%d" % (int(m.group(3)[2:]) + 1))
    return sorted(read_by_copies - written)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: check_ldgsts_registers.py BINARY [BINARY ...]")
    failed = False
    for path in sys.argv[1:]:
        try:
            dump = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True)
        except FileNotFoundError:
            sys.exit("check_ldgsts_registers.py: cuobjdump not found (it comes with the CUDA toolkit)")
        if dump.returncode != 0:
            sys.exit("check_ldgsts_registers.py: cuobjdump could not read %s: %s"
                     % (path, dump.stderr.strip()))
        sass = dump.stdout
        faults = []
        for function in re.split(r"\n\s*Function : ", sass)[1:]:
            name = function.split("\n", 1)[0]
            shape = re.search(r"decode_attention_kernelILi(\d+)ELi(\d+)", name)
            if not shape:
                continue
            missing = unwritten_copy_registers(function)
            if missing:
                faults.append("%s/%s: %s" % (shape.group(1), shape.group(2), ",".join(missing)))
        print(path, "ok" if not faults else "LDGSTS read unwritten " + "; ".join(faults))
        failed |= bool(faults)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
