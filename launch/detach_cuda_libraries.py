#!/usr/bin/env python3
"""Takes LibTorch's CUDA half out of the trainer binary's load-time dependencies, after its link.

libtorch_cuda.so, libc10_cuda.so, libnccl.so.2 and libtorch.so (a shim that needs libtorch_cuda) are
removed from the binary's DT_NEEDED entries (patchelf --remove-needed), so a process starts without
them: 0.12 s of CPU and 350 MB of resident memory less on a machine without a GPU, where they can do
nothing. main() loads them with dlopen where an NVIDIA driver is installed (common/device.h,
load_cuda_runtime), before anything calls into them; the binary's calls into them are bound at their
first call (lazy binding, the default), to the loaded libraries.

That works only for calls through the procedure linkage table. A reference to a variable of these
libraries (a copy relocation, an address in the global offset table) is bound when the binary starts
and would stop it with "undefined symbol" before main. So first every relocation of the binary is
checked: one against a symbol these libraries define, other than a function call's, fails the build
naming the symbol. Without those libraries among its dependencies (a CPU-only LibTorch), nothing is
done.

    detach_cuda_libraries.py BINARY [--patchelf PATCHELF]
"""
import argparse
import os
import re
import subprocess
import sys

DETACHED = ("libtorch_cuda.so", "libc10_cuda.so", "libnccl.so.2", "libtorch.so")


def run(*command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def needed(binary):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-dW", binary))


def resolved_paths(binary):
    """{library name: path} as the dynamic linker finds them for this binary."""
    paths = {}
    for line in run("ldd", binary).splitlines():
        match = re.match(r"\s*(\S+) => (\S+) \(", line)
        if match:
            paths[match.group(1)] = match.group(2)
    return paths


def defined_symbols(library):
    symbols = set()
    for line in run("readelf", "--dyn-syms", "-W", library).splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name; Ndx UND is an import, not a definition.
        if len(fields) >= 8 and fields[0].endswith(":") and fields[6] != "UND":
            symbols.add(fields[7].split("@")[0])
    return symbols


def relocations(binary):
    """(type, symbol) of every dynamic relocation that names a symbol."""
    found = []
    for line in run("readelf", "-rW", binary).splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[2].startswith("R_"):
            found.append((fields[2], fields[4].split("@")[0]))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--patchelf", default="patchelf")
    args = parser.parse_args()

    dependencies = needed(args.binary)
    detached = [name for name in dependencies if name in DETACHED]
    if not detached:
        return  # a CPU-only LibTorch, or done already
    paths = resolved_paths(args.binary)
    missing = [name for name in dependencies if name not in paths and not name.startswith("ld-linux")]
    if missing:
        sys.exit(f"detach_cuda_libraries.py: ldd finds no {', '.join(missing)} for {args.binary}")
    # The library that binds a symbol is the first of the dependencies, in order, that defines it.
    binder = {}
    for name in dependencies:
        if name in paths:
            for symbol in defined_symbols(paths[name]):
                binder.setdefault(symbol, name)
    bound_at_start = sorted({(kind, symbol) for kind, symbol in relocations(args.binary)
                             if binder.get(symbol) in detached and kind != "R_X86_64_JUMP_SLOT"})
    if bound_at_start:
        names = run("c++filt", *[symbol for _, symbol in bound_at_start]).split("\n")
        lines = "\n".join(f"  {kind} {name} ({binder[symbol]})"
                          for (kind, symbol), name in zip(bound_at_start, names))
        sys.exit(f"detach_cuda_libraries.py: {args.binary} refers to variables of LibTorch's CUDA libraries, which "
                 f"are bound when it starts, before they are loaded:\n{lines}\nReach them through a function "
                 "instead (an inline function that reads such a variable is the usual cause; common/device.h).")
    command = [args.patchelf]
    for name in detached:
        command += ["--remove-needed", name]
    subprocess.run(command + [args.binary], check=True)
    left = [name for name in needed(args.binary) if name in DETACHED]
    if left:
        sys.exit(f"detach_cuda_libraries.py: {args.binary} still needs {', '.join(left)}")


if __name__ == "__main__":
    main()
