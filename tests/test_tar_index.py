import io
import tarfile
import zlib

import pytest

from distattn.corpus.tar_index import _fast_index, _Unsupported, index_regular_files


def make_tar(fmt, names):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, name in enumerate(names):
            data = (f"review {i} " * (i + 1)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("a_dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
    return buf.getvalue()


def reference(data):
    tf = tarfile.open(fileobj=io.BytesIO(data))
    return [(m.name, m.offset_data, m.size) for m in tf.getmembers() if m.isfile()]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_same_as_tarfile(fmt):
    names = ["aclImdb/train/pos/0_9.txt", "x" * 120 + "/long_name_" + "y" * 90 + ".txt" if fmt != tarfile.USTAR_FORMAT
             else "p" * 60 + "/" + "q" * 90 + ".txt", "é/ünïcode.txt"]
    data = make_tar(fmt, names)
    assert index_regular_files(data) == reference(data)
    if fmt == tarfile.PAX_FORMAT:                       # pax headers: the tarfile fallback answers
        with pytest.raises(_Unsupported):
            _fast_index(data)
    else:                                               # the fast path itself, not the fallback, agrees
        assert _fast_index(data) == reference(data)


def test_fast_path_is_taken_for_gnu():
    data = make_tar(tarfile.GNU_FORMAT, ["a.txt", "b" * 150 + ".txt"])
    assert _fast_index(data) == reference(data)


def test_truncated_image_raises():
    data = make_tar(tarfile.GNU_FORMAT, ["a.txt", "b.txt"])
    with pytest.raises((tarfile.ReadError, EOFError)):
        index_regular_files(data[:700])


@pytest.mark.imdb
def test_imdb_archive_index_equals_tarfile(imdb_archive):
    data = zlib.decompress(imdb_archive.read_bytes(), 47)
    ref = reference(data)
    assert _fast_index(data) == ref and index_regular_files(data) == ref


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
def test_regular_files_are_those_tarfile_calls_files(fmt):
    # a contiguous file (type "7") is a regular file to tarfile and was dropped; an old-style
    # directory (type "\0" with a trailing "/") is not, and was listed
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, kind, data in (("a/1_9.txt", tarfile.CONTTYPE, b"hello"), ("b/2_8.txt", tarfile.REGTYPE, b"x"),
                                 ("c/", tarfile.AREGTYPE, b""), ("d/3_7.txt", tarfile.AREGTYPE, b"yz")):
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            tf.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    assert [n for n, _, _ in reference(data)] == ["a/1_9.txt", "b/2_8.txt", "d/3_7.txt"]
    assert _fast_index(data) == reference(data)


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.SYMTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE, "old-dir"])
def test_links_and_directories_with_a_size_field_carry_no_data(kind):
    # old tar writers store a hard link's target size in its size field; no data follows the
    # header (GNU tar, bsdtar and tarfile ignore the field). The fast path skipped that many
    # blocks: here (600 bytes, two blocks) b.txt's header and data, landing on d.txt's header,
    # so b.txt was silently dropped.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, typ, size, data in (("a.txt", tarfile.REGTYPE, 3, b"abc"),
                                      ("c/" if kind == "old-dir" else "link", tarfile.AREGTYPE if kind == "old-dir" else kind,
                                       600, None),
                                      ("b.txt", tarfile.REGTYPE, 2, b"xy"), ("d.txt", tarfile.REGTYPE, 2, b"zw")):
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = typ, size, "a.txt"
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    data = buf.getvalue()
    assert [n for n, _, _ in reference(data)] == ["a.txt", "b.txt", "d.txt"]
    assert index_regular_files(data) == reference(data) and _fast_index(data) == reference(data)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_damaged_header_after_the_first_member_raises(fmt):
    # tarfile stops listing at the first header it cannot read (here c.txt's, one flipped
    # byte: a bad checksum) and returns the members before it; the fallback passed that on,
    # so c.txt was silently missing. PAX: the fast path hands b's pax header to tarfile.
    data = make_tar(fmt, ["a.txt", "b/é.txt", "c.txt"])
    third = [m for m in tarfile.open(fileobj=io.BytesIO(data)).getmembers() if m.name == "c.txt"][0].offset
    damaged = bytearray(data)
    damaged[third + 1] ^= 0x01
    with pytest.raises(tarfile.ReadError, match="damaged"):
        index_regular_files(bytes(damaged))
    partial = data[:third + 300]                       # a partial header where c.txt's starts
    with pytest.raises(tarfile.ReadError):
        index_regular_files(partial)


@pytest.mark.parametrize("end_marker", [False, True])
def test_a_long_name_header_without_its_member_raises(end_marker):
    # cut on a block boundary right after a GNU long-name header (and its name data): tarfile
    # refuses the image ("empty header" / "end of file header"); the fast path returned the
    # members before it, silently dropping the one the long name belongs to
    data = make_tar(tarfile.GNU_FORMAT, ["a.txt", "b" * 150 + ".txt"])
    second = [m for m in tarfile.open(fileobj=io.BytesIO(data)).getmembers() if m.name.startswith("b")][0]
    cut = data[:second.offset_data - tarfile.BLOCKSIZE] + (b"\0" * 2 * tarfile.BLOCKSIZE if end_marker else b"")
    with pytest.raises(tarfile.ReadError):
        reference(cut)
    with pytest.raises(tarfile.ReadError, match="b{150}.txt.*truncated"):
        index_regular_files(cut)



@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_cut_on_a_block_boundary_names_the_member(fmt):
    # the last member's data cut short on a 512-byte boundary is refused, naming the member
    # (PAX, through tarfile: it said only "unexpected end of data"); an image that ends right
    # after a complete member (no end-of-archive blocks) is accepted, as tarfile and GNU tar do
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, size in (("a.txt", 3), ("b/é.txt", 700), ("c/long.txt", 2000)):
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(b"x" * size))
    data = buf.getvalue()
    last = reference(data)[-1]
    for cut in range(last[1], last[1] + last[2], tarfile.BLOCKSIZE):
        with pytest.raises(tarfile.ReadError, match="member c/long.txt runs past the end"):
            index_regular_files(data[:cut])
    complete = data[:last[1] + -(-last[2] // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE]
    assert index_regular_files(complete) == reference(complete) == reference(data)
