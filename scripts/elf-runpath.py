#!/usr/bin/env python3
"""Prints, or trims to its $ORIGIN entries, the runpath of an ELF64 little-endian file.

    scripts/elf-runpath.py FILE               prints DT_RUNPATH (or DT_RPATH)
    scripts/elf-runpath.py --origin-only FILE keeps only the $ORIGIN-relative entries, in place

build.rs links the CLI and the Node addon with RUNPATH `$ORIGIN/mlx/lib:<build prefix>/mlx/lib`:
the second entry lets the binaries in target/ run where they were built. A packaged copy must not
carry it (a path of the build machine; on a user's machine with that path it would load the wrong
libmlx), so the packaging scripts trim it. The string is rewritten in place in .dynstr, shortened
and padded with NULs; no tool beyond Python is needed (no patchelf). It refuses when another
dynamic string shares the bytes it would clear (a linker's suffix merging).
"""
import struct
import sys

DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
SHT_DYNSYM, SHT_GNU_VERNEED, SHT_GNU_VERDEF = 11, 0x6FFFFFFE, 0x6FFFFFFD


def fail(msg):
    sys.exit(f"elf-runpath: {msg}")


def parse(data):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        fail("not an ELF64 little-endian file")
    (phoff, shoff) = struct.unpack_from("<QQ", data, 0x20)
    (phentsize, phnum, shentsize, shnum) = struct.unpack_from("<HHHH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        fail("no dynamic section")
    entries = []
    off, end = dynamic[0], dynamic[0] + dynamic[1]
    while off < end:
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        entries.append((tag, val))
        off += 16

    def file_offset(vaddr):
        for v, o, size in loads:
            if v <= vaddr < v + size:
                return vaddr - v + o
        fail(f"address {vaddr:#x} is in no loaded segment")

    strtab = file_offset(next(v for t, v in entries if t == DT_STRTAB))
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    return entries, strtab, sections


def cstr(data, off):
    return data[off : data.index(b"\0", off)].decode()


def other_string_offsets(data, entries, sections, strtab):
    """Offsets into .dynstr of every other name the dynamic linker reads."""
    offs = [v for t, v in entries if t in (DT_NEEDED, DT_SONAME)]
    for _, sh_type, _, _, sh_offset, sh_size, sh_link, sh_info, _, sh_entsize in sections:
        linked = sections[sh_link][4] if sh_link < len(sections) else None
        if linked != strtab:
            continue
        if sh_type == SHT_DYNSYM:
            for i in range(sh_size // sh_entsize):
                offs.append(struct.unpack_from("<I", data, sh_offset + i * sh_entsize)[0])
        elif sh_type == SHT_GNU_VERNEED:
            off = sh_offset
            for _ in range(sh_info):
                _, cnt, file, aux, nxt = struct.unpack_from("<HHIII", data, off)
                offs.append(file)
                a = off + aux
                for _ in range(cnt):
                    _, _, _, name, anext = struct.unpack_from("<IHHII", data, a)
                    offs.append(name)
                    a += anext
                off += nxt
                if nxt == 0:
                    break
        elif sh_type == SHT_GNU_VERDEF:
            off = sh_offset
            for _ in range(sh_info):
                _, _, _, cnt, _, aux, nxt = struct.unpack_from("<HHHHIII", data, off)
                a = off + aux
                for _ in range(cnt):
                    name, anext = struct.unpack_from("<II", data, a)
                    offs.append(name)
                    a += anext
                off += nxt
                if nxt == 0:
                    break
    return offs


def main():
    args = sys.argv[1:]
    trim = args[:1] == ["--origin-only"]
    if trim:
        args = args[1:]
    if len(args) != 1:
        fail("usage: elf-runpath.py [--origin-only] FILE")
    path = args[0]
    data = bytearray(open(path, "rb").read())
    entries, strtab, sections = parse(data)
    paths = [(t, v) for t, v in entries if t in (DT_RUNPATH, DT_RPATH)]
    if not paths:
        fail(f"{path} has no runpath")
    for tag, val in paths:
        old = cstr(data, strtab + val)
        if not trim:
            print(old)
            continue
        new = ":".join(p for p in old.split(":") if p.startswith("$ORIGIN"))
        if not new:
            fail(f"{path}: no $ORIGIN entry in {old!r}")
        if new == old:
            continue
        start, stop = val + len(new), val + len(old)
        shared = [o for o in other_string_offsets(data, entries, sections, strtab) if start <= o < stop]
        if shared:
            fail(f"{path}: another dynamic string shares the runpath's bytes; not trimming")
        data[strtab + start : strtab + stop] = b"\0" * (stop - start)
        print(f"elf-runpath: {path}: {old} -> {new}", file=sys.stderr)
    if trim:
        open(path, "wb").write(data)


if __name__ == "__main__":
    main()
