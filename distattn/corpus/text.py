"""A user's own corpus: a ``.txt`` file (one document per line; a line ends at ``\\n`` or
``\\r\\n``, whatever the encoding), a directory of ``.txt``
files (one document per file, searched recursively and sorted by relative path; hidden files and
directories below it, whose names start with ``.``, such as ``.#notes.txt`` or
``.ipynb_checkpoints/``, are skipped; another subdirectory that cannot be listed is an error), or a ``.jsonl`` file whose lines are
objects with a ``text`` field, an optional integer ``label`` and an optional ``split`` (a
non-empty name without ``+``, which joins splits when selecting them, and without spaces at its
ends; ``"all"`` when absent); each of these keys at most once in an object.

Every record is one document, in file order, even one without text: an empty or blank line of a
``.txt`` file, an empty file of a directory and a ``.jsonl`` object with ``"text": ""`` are
documents without tokens (so document k of a ``.txt`` file is its line k + 1, named ``line{k+1}``).
A blank line of a ``.jsonl`` file holds no object and is skipped (its documents are named after
their lines, ``line{i}``)."""

from __future__ import annotations

import codecs
import json
import os
import time
import warnings
from pathlib import Path
from typing import Iterator

from distattn.atomic import sha256_file
from distattn.corpus.documents import NO_LABEL, Corpus, Document, check_split

# a file whose timestamps are this close to now is "racily clean" (git's term): a rewrite of the same
# size within the file system's timestamp granularity would leave size, mtime and ctime as they are.
# Whole-second timestamps: a 1 s or 2 s file system (FAT, HFS+, ext3); else a clock tick (ext4 and
# tmpfs before Linux 6.13 stamp with the kernel's coarse clock, a tick of 1 to 10 ms), with a margin
RACY_NS_COARSE = 2_050_000_000
RACY_NS_FINE = 20_000_000

SUPPORTED = (".txt file (one document per line)", "directory of .txt files", ".jsonl file with a 'text' field")


class TextCorpus(Corpus):
    """Documents from a path; see the module docstring for the accepted layouts."""

    name = "text"

    def __init__(self, path: str | os.PathLike, encoding: str = "utf-8"):
        if path is None or str(path) == "":
            raise ValueError("the text corpus needs a path (--path FILE_OR_DIR); accepted: " + "; ".join(SUPPORTED))
        self.path = Path(path).expanduser()
        try:
            info = codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ValueError(f"encoding={encoding!r} is not a codec Python knows; allowed: e.g. 'utf-8', "
                             f"'latin-1', 'cp1252'") from None
        # bytes-to-bytes and str-to-str codecs (hex, base64, zlib, rot13) are codecs too, but no
        # file can be read as text with them: reading raised a bare LookupError
        if not getattr(info, "_is_text_encoding", True):
            raise ValueError(f"encoding={encoding!r} is not a text encoding; allowed: e.g. 'utf-8', 'latin-1', "
                             f"'cp1252'")
        self.encoding = info.name
        if not self.path.exists():
            raise FileNotFoundError(f"text corpus path {str(self.path)!r} does not exist; accepted: "
                                    + "; ".join(SUPPORTED))
        if self.path.is_dir():
            self.kind = "dir"
            # the suffix in any case, as for a single file: rglob("*.txt") left out B.TXT without a word
            found = sorted(p for p in _walk(self.path) if p.suffix.lower() == ".txt" and p.is_file())
            # hidden files and directories below the root (editor temporaries such as .#notes.txt,
            # .ipynb_checkpoints/, .git/) are no documents; the root itself may be under a hidden one
            self._files = [p for p in found if not _hidden(p.relative_to(self.path))]
            if not self._files:
                raise ValueError(f"directory {str(self.path)!r} contains no .txt files"
                                 + (f" (skipped {len(found)} hidden: a name starting with '.' below the "
                                    "directory)" if found else ""))
        elif self.path.suffix.lower() == ".txt":
            self.kind = "txt"
        elif self.path.suffix.lower() == ".jsonl":
            self.kind = "jsonl"
        else:
            raise ValueError(f"unsupported text corpus {str(self.path)!r} (suffix {self.path.suffix!r}); "
                             "accepted: " + "; ".join(SUPPORTED))

    def files(self) -> list[Path]:
        """The files the corpus reads: the documents of a directory, or the one file."""
        return self._files if self.kind == "dir" else [self.path]

    def fingerprint(self) -> dict:
        files = self.files()
        # size and mtime alone missed a rewrite whose mtime was restored (cp -p, rsync -t, tar,
        # os.utime); the change time cannot be set back, and any write or utime moves it
        stats, racy = _settled_stats(files)
        # reader 2: a leading UTF-8 byte-order mark is dropped (it was read as part of the first
        # word), so tokens cached by reader 1 are not reused; reader 3 (.jsonl): a null 'split' is
        # 'all', no longer 'None'; reader 4 (.jsonl): a key given twice is refused (the last one was kept)
        return {"corpus": "text", "reader": 4 if self.kind == "jsonl" else 2, "path": str(self.path.resolve()), "kind": self.kind,
                # "bom": a leading U+FEFF is dropped in every encoding (utf-16-le/-be and utf-32-le/-be kept it)
                **({} if self.encoding == "utf-8" else {"encoding": self.encoding, "line_end": "lf", "bom": "dropped"}),
                "files": [(str(p.relative_to(self.path)) if self.kind == "dir" else p.name,
                           st.st_size, st.st_mtime_ns, st.st_ctime_ns) + ((sha256_file(p),) if r else ())
                          for p, st, r in zip(files, stats, racy)]}

    def __iter__(self) -> Iterator[Document]:
        if self.kind == "dir":
            for p in self._files:
                yield Document(self._drop_bom(self._utf8(p.read_bytes(), p)), split="all",
                               name=str(p.relative_to(self.path)))
        elif self.kind == "txt":
            warned = False
            for i, line in self._txt_lines():
                if not warned and b"\r" in line:
                    warned = _warn_inner_cr(self.path, i)
                yield Document(line, split="all", name=f"line{i}")
        else:
            for i, line in self._jsonl_lines():
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line, object_pairs_hook=_Object.from_pairs)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                # json.loads keeps the last of two equal keys: {"text": "a", "text": "b"} was read as "b"
                twice = [k for k in getattr(obj, "duplicates", ()) if k in ("text", "label", "split")]
                if twice:
                    raise ValueError(f"{self.path}:{i}: the key {twice[0]!r} appears more than once in the object; "
                                     "which value is meant is ambiguous: keep one")
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise ValueError(f"{self.path}:{i}: each line must be an object with a string 'text' field")
                if "\\u" in line:      # JSON's \ud800 escape gives a lone surrogate: no text, and no UTF-8
                    try:
                        obj["text"].encode("utf-8")
                    except UnicodeEncodeError as exc:   # once a UnicodeEncodeError from a tokenizer, naming no line
                        raise ValueError(f"{self.path}:{i}: 'text' holds an unpaired UTF-16 surrogate "
                                         f"(U+{ord(exc.object[exc.start]):04X}), which is not a character") from None
                label = obj.get("label", NO_LABEL)
                if label is None:
                    label = NO_LABEL
                if not isinstance(label, int) or isinstance(label, bool) or not -1 <= label <= 127:
                    raise ValueError(f"{self.path}:{i}: 'label' must be an integer in [-1, 127], got {label!r}")
                split = obj.get("split")
                if split is None:
                    split = "all"
                # not a string: str() made null the split 'None'; .split() reads 'a+b' as two splits,
                # refuses '' and strips spaces: such a split was read, and then no name selected it
                check_split(split, f"{self.path}:{i}")
                yield Document(obj["text"], label=label, split=split, name=f"line{i}")

    def _txt_lines(self) -> Iterator[tuple[int, bytes]]:
        """``(line number, UTF-8 bytes)`` of a .txt file; a line ends at ``\\n`` (a trailing ``\\r``
        is dropped) in every encoding."""
        if self.encoding == "utf-8":
            with open(self.path, "rb") as fh:
                for i, line in enumerate(fh, 1):
                    yield i, self._drop_bom(self._utf8(line.rstrip(b"\r\n"), self.path, i), i)
        else:                                  # decoded before splitting: a UTF-16 newline is two bytes
            for i, line in self._decoded_lines(newline="\n"):
                yield i, self._drop_bom(line.rstrip("\r\n").encode("utf-8"), i)

    def _jsonl_lines(self) -> Iterator[tuple[int, str]]:
        if self.encoding != "utf-8":
            for i, line in self._decoded_lines():
                yield i, line[1:] if i == 1 and line.startswith("\ufeff") else line
            return
        with open(self.path, "rb") as fh:             # line by line, so that a bad byte is reported with its line
            for i, raw in enumerate(fh, 1):
                yield i, self._drop_bom(self._utf8(raw, self.path, i), i).decode("utf-8")

    def _decoded_lines(self, newline=None) -> Iterator[tuple[int, str]]:
        """``(line number, text)`` of a file in a declared encoding other than UTF-8."""
        i = 0
        try:
            with open(self.path, encoding=self.encoding, newline=newline) as fh:
                for i, line in enumerate(fh, 1):
                    yield i, line
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: not valid {self.encoding} after line {i} ({exc.reason}); pass the "
                             f"file's encoding as encoding=") from None

    def _drop_bom(self, raw: bytes, line: int = 1) -> bytes:
        """A file's first line (as UTF-8 bytes) without its byte-order mark (U+FEFF, as Windows
        editors write it): it is no character of the text, and ``str.split`` kept it on the first
        word (``"\\ufeffthe"``, another type than ``"the"``). Some codecs (utf-8-sig, utf-16,
        utf-32) drop it when decoding, others keep it (utf-8, utf-16-le/-be, utf-32-le/-be): it is
        dropped here whatever the encoding. In UTF-8 it is dropped after the UTF-8 check, so that a
        bad byte's offset counts it."""
        if line == 1 and raw.startswith(codecs.BOM_UTF8):
            return raw[len(codecs.BOM_UTF8):]
        return raw

    def _utf8(self, raw: bytes, path: Path, line: int | None = None) -> bytes:
        """Documents are UTF-8 bytes: input is checked against its encoding (a byte that does not
        decode is an error naming the file and line, never silently replaced); another encoding is
        re-encoded here."""
        if self.encoding != "utf-8":
            try:
                return raw.decode(self.encoding).encode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}: not valid {self.encoding} ({exc.reason}); pass the file's encoding as "
                                 f"encoding=") from None
        if not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = f"{path}:{line}" if line is not None else str(path)
                raise ValueError(f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1}); "
                                 f"re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or from Python "
                                 f"pass get_corpus('text', path=..., encoding='latin-1')") from None
        return raw

    def __repr__(self) -> str:
        return f"TextCorpus({str(self.path)!r}, kind={self.kind!r})"


class _Object(dict):
    """A JSON object that remembers the keys it was given more than once (``duplicates``)."""

    duplicates: tuple = ()

    @classmethod
    def from_pairs(cls, pairs: list) -> dict:
        obj = cls(pairs)
        if len(obj) != len(pairs):
            seen: set = set()
            obj.duplicates = tuple(k for k, _ in pairs if k in seen or seen.add(k))
        return obj


def _settled_stats(files: list[Path]) -> tuple[list[os.stat_result], list[bool]]:
    """The files' stats, taken once no file was changed within its timestamp granularity, so that a
    later rewrite of the same size moves a timestamp: a fingerprint taken while a file was still
    racy kept its key after such a rewrite, and the stale cache was served. A file just written is
    waited for (at most ``RACY_NS_COARSE``) rather than hashed: a hash in the key would change it
    once the file settles, and every stage cached on it would be rebuilt. One still racy after the
    wait (written meanwhile, or stamped in the future) is marked, for hashing."""
    stats = [p.stat() for p in files]
    waits = [_racy_ns(st) for st in stats]
    # a file stamped further ahead is hashed, and does not stop the wait for the others
    wait = max((w for w in waits if w <= RACY_NS_COARSE), default=0)
    if wait > 0:
        time.sleep(wait / 1e9)
        for i in [i for i, w in enumerate(waits) if w > 0]:
            stats[i] = files[i].stat()
            waits[i] = _racy_ns(stats[i])
    return stats, [w > 0 for w in waits]


def _racy_ns(st: os.stat_result) -> int:
    """Nanoseconds until a change of the file would get other timestamps than ``st``'s (<= 0: now)."""
    coarse = st.st_mtime_ns % 10**9 == 0 and st.st_ctime_ns % 10**9 == 0
    return max(st.st_mtime_ns, st.st_ctime_ns) + (RACY_NS_COARSE if coarse else RACY_NS_FINE) - time.time_ns()


def _walk(root: Path) -> Iterator[Path]:
    """Every file below a directory, as ``rglob("*")`` found them (symbolic links to directories
    are not followed); a directory that cannot be listed is an error naming it (``rglob`` skipped
    it and its documents without a word), unless it is hidden, whose files are no documents."""
    def refuse(exc: OSError):
        where = Path(exc.filename) if exc.filename is not None else root
        try:
            if _hidden(where.relative_to(root)):
                return
        except ValueError:
            pass
        raise ValueError(f"cannot list directory {str(where)!r} of the text corpus {str(root)!r} "
                         f"({exc.strerror or exc}); its .txt files would be left out: make it readable or "
                         "move it out of the corpus") from None
    for folder, _, names in os.walk(root, onerror=refuse):
        for name in names:
            yield Path(folder) / name


def _hidden(relative: Path) -> bool:
    """Whether a path below a directory corpus's root has a hidden component (a name starting with '.')."""
    return any(part.startswith(".") for part in relative.parts)


def _warn_inner_cr(path: Path, line: int) -> bool:
    warnings.warn(f"{path}:{line}: a carriage return (\\r) inside a line; a .txt corpus has one document per "
                  "\\n-terminated line (\\r\\n also ends one), so a file with old Mac line endings (\\r alone) "
                  "reads as one long document: convert it first, e.g. tr '\\r' '\\n'", stacklevel=3)
    return True
