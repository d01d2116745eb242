"""The GNU Build ID of an ELF file, read from its PT_NOTE program headers (standard
library only: this module's source is also sent, as it is, into the serving container by
:mod:`pytest_spark.infra.loaded.probe`, where no readelf may exist).

Layout (ELF gABI; goblin's ``NT_GNU_BUILD_ID = 3``): each note is ``uint32 namesz, descsz,
type``, the name (``GNU\\0``) padded to 4 bytes, the descriptor (the ID bytes, 20 for
``ld --build-id=sha1``) padded to the segment's alignment (4, or 8 for 8-aligned notes)."""

from __future__ import annotations

import struct
from typing import BinaryIO

NT_GNU_BUILD_ID = 3
PT_NOTE = 4
MAX_NOTE_BYTES = 1 << 16


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def build_id_of(f: BinaryIO) -> str | None:
    """The Build ID (lower-case hex) of the open ELF file ``f`` (binary, seekable), or
    None when it has none; ValueError when ``f`` is not ELF."""
    f.seek(0)
    ident = f.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF":
        raise ValueError("not an ELF file (no \\x7fELF magic)")
    wide, endian = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if wide:
        phoff = struct.unpack_from(endian + "Q", ident, 0x20)[0]
        phentsize, phnum = struct.unpack_from(endian + "HH", ident, 0x36)
    else:
        phoff = struct.unpack_from(endian + "I", ident, 0x1C)[0]
        phentsize, phnum = struct.unpack_from(endian + "HH", ident, 0x2A)
    for i in range(min(phnum, 256)):
        f.seek(phoff + i * phentsize)
        ph = f.read(phentsize)
        if len(ph) < (56 if wide else 32):
            break
        if struct.unpack_from(endian + "I", ph, 0)[0] != PT_NOTE:
            continue
        if wide:
            offset, size, align = (struct.unpack_from(endian + "Q", ph, o)[0] for o in (8, 32, 48))
        else:
            offset, size, align = (struct.unpack_from(endian + "I", ph, o)[0] for o in (4, 16, 28))
        found = _notes_build_id(f, offset, min(size, MAX_NOTE_BYTES), endian, align)
        if found:
            return found
    return None


def _notes_build_id(f: BinaryIO, offset: int, size: int, endian: str, align: int) -> str | None:
    f.seek(offset)
    data = f.read(size)
    align = 8 if align == 8 else 4
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from(endian + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + _pad(namesz, 4)
        if desc_at + descsz > len(data):
            return None
        name = data[name_at : name_at + namesz].rstrip(b"\0")
        if kind == NT_GNU_BUILD_ID and name == b"GNU" and descsz:
            return data[desc_at : desc_at + descsz].hex()
        pos = desc_at + _pad(descsz, align)
    return None
