"""A fast index of the regular files in an uncompressed tar image held in memory.

``tarfile.getmembers()`` spends about 2 s on the 100,016 members of the IMDB archive; the
headers of plain ustar/GNU archives can be read directly in a tenth of that. Anything this
reader does not handle (PAX headers, sparse files, a bad checksum) makes it hand over to
``tarfile``, so the result is always what ``tarfile`` would give, except that a damaged or
truncated archive raises ``tarfile.ReadError`` where ``tarfile`` lists the members before the
damage and stops. A member whose data runs past the end of the image is refused, with its name.

An image that ends right after a complete member, without the two zero blocks that mark the end
of an archive, is accepted (as ``tarfile`` and GNU tar accept it, without a warning): a cut
exactly between two members cannot be told from it here. ``read_imdb_archive``'s review counts
per folder catch such a cut in the IMDB archive.
"""

from __future__ import annotations

import io
import tarfile

_BLOCK = 512
_SIMPLE_TYPES = {b"0", b"\0", b"5", b"1", b"2", b"3", b"4", b"6", b"7"}


class _Unsupported(Exception):
    pass


def _octal(field: bytes) -> int:
    field = field.rstrip(b"\0 ").lstrip(b" ")
    if field and field[0] & 0x80:  # GNU base-256 for large sizes
        raise _Unsupported
    return int(field or b"0", 8)


def _fast_index(data: bytes | memoryview) -> list[tuple[str, int, int]]:
    view = memoryview(data)
    out = []
    pos = 0
    long_name = None
    n = len(view)
    while pos + _BLOCK <= n:
        header = bytes(view[pos:pos + _BLOCK])
        if header == b"\0" * _BLOCK:
            break
        stored = _octal(header[148:156])
        if stored != sum(header[:148]) + 256 + sum(header[156:]):
            raise _Unsupported
        size = _octal(header[124:136])
        kind = header[156:157]
        data_start = pos + _BLOCK
        pos = data_start + -(-size // _BLOCK) * _BLOCK
        if kind == b"L":  # GNU long name: the next member's name is this member's data
            long_name = bytes(view[data_start:data_start + size]).rstrip(b"\0").decode("utf-8")
            continue
        if kind not in _SIMPLE_TYPES:
            raise _Unsupported
        short = header[:100].split(b"\0", 1)[0]
        # tarfile's regular files: REGTYPE, AREGTYPE (unless its header name ends in "/": an
        # old-style directory) and CONTTYPE ("7", a contiguous file)
        regular = kind in (b"0", b"7") or (kind == b"\0" and not short.endswith(b"/"))
        if not regular:  # links, directories, devices, fifos have no data, whatever their size field says
            pos = data_start
        if long_name is not None:
            name, long_name = long_name, None
        else:
            name = short
            if header[257:262] == b"ustar":
                prefix = header[345:500].split(b"\0", 1)[0]
                if prefix:
                    name = prefix + b"/" + name
            name = name.decode("utf-8")
        if regular:
            if data_start + size > n:
                raise tarfile.ReadError(f"member {name} runs past the end of the archive (truncated)")
            out.append((name, data_start, size))
    else:
        if pos != n:  # a partial header, or the last member's data runs past the end
            raise tarfile.ReadError("unexpected end of data: the tar archive is truncated")
    if long_name is not None:  # a GNU long name, then the end: its member's header is missing
        raise tarfile.ReadError(f"member {long_name} has a GNU long-name header but no header of its own: "
                                "the tar archive is truncated")
    return out


def index_regular_files(data: bytes) -> list[tuple[str, int, int]]:
    """``(name, data_offset, size)`` of every regular file in the tar image ``data``.

    Raises ``tarfile.ReadError`` (or ``EOFError``) if the image is not a readable tar archive.
    """
    try:
        return _fast_index(data)
    except (_Unsupported, ValueError, UnicodeDecodeError):
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        try:
            members = archive.getmembers()
        except tarfile.ReadError as exc:
            # tarfile says only "unexpected end of data" when the last member it read runs past the end
            if str(exc) != "unexpected end of data" or not archive.members:
                raise
            raise tarfile.ReadError(f"member {archive.members[-1].name} runs past the end of the archive "
                                    "(truncated)") from None
        # past the first member, tarfile ends the listing without a word at a header it cannot
        # read (a bad checksum, a non-number in a field, a partial block): the rest is lost
        stop = bytes(memoryview(data)[archive.offset:archive.offset + _BLOCK])
        if stop.strip(b"\0"):
            raise tarfile.ReadError(f"invalid tar header at offset {archive.offset} (after {len(members)} "
                                    "members): the archive is damaged or truncated")
        return [(m.name, m.offset_data, m.size) for m in members if m.isfile()]
