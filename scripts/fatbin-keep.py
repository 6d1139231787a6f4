#!/usr/bin/env python3
"""Blank the GPU code of every architecture but the ones kept in a shared library's
`.nv_fatbin` section, so the library compresses to a fraction of its size.

    python3 scripts/fatbin-keep.py IN.so OUT.so --keep 90     # list, then write OUT
    python3 scripts/fatbin-keep.py IN.so                      # list only

A CUDA fat binary holds one machine-code image per GPU architecture (and optionally PTX);
the driver loads the image whose architecture matches the GPU and never reads the others.
`scripts/gpu-pack.sh` uses this to carry ONNX Runtime's CUDA provider to a machine with
an H100/H200 (sm_90) in fewer pieces: the other architectures' images are overwritten
with zeros in place — every header, size and offset stays as it was, so the file is
still a valid library, and it runs on the kept architectures only. Refuses to blank a
library that has no image for a kept architecture (the result would not run there).
"""
import argparse
import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "cubin"}


def section(data, wanted):
    """(offset, size) of the ELF64 section named `wanted`."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit("not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    strtab_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        header = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", data, header)
        end = data.index(b"\0", strtab_off + name_off)
        if data[strtab_off + name_off:end].decode() == wanted:
            offset, size = struct.unpack_from("<QQ", data, header + 0x18)
            return offset, size
    sys.exit(f"no {wanted} section: not a library with CUDA code")


def entries(data, offset, size):
    """Every (kind, sm, payload_start, payload_len) of every fat binary in the section."""
    pos, end = offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned; skip padding between them
            continue
        entry, stop = pos + header_size, pos + header_size + fat_size
        while entry < stop:
            kind, _ver, entry_header, padded = struct.unpack_from("<HHIQ", data, entry)
            sm, = struct.unpack_from("<I", data, entry + 28)
            yield kind, sm, entry + entry_header, padded
            entry += entry_header + padded
        pos = stop


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--keep", default="", help="architectures to keep, e.g. 90 or 80,90")
    args = parser.parse_args()
    data = bytearray(open(args.library, "rb").read())
    offset, size = section(data, ".nv_fatbin")
    keep = {int(a) for a in args.keep.split(",") if a}
    sizes, counts = collections.Counter(), collections.Counter()
    blanked = 0
    for kind, sm, start, length in entries(data, offset, size):
        key = (KINDS.get(kind, f"kind{kind}"), sm)
        sizes[key] += length
        counts[key] += 1
        if args.out and sm not in keep:
            data[start:start + length] = bytes(length)
            blanked += length
    for (kind, sm), total in sorted(sizes.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"sm_{sm:<4} {kind:<6} {counts[(kind, sm)]:>5} images {total / 2**20:8.1f} MiB")
    if args.out:
        if not keep or not any(sm in keep for (_kind, sm) in sizes):
            sys.exit(f"no image for architecture(s) {sorted(keep)}: refusing to write a library that cannot run there")
        open(args.out, "wb").write(data)
        print(f"kept sm_{sorted(keep)}, blanked {blanked / 2**20:.1f} MiB, wrote {args.out}")


if __name__ == "__main__":
    main()
