import hashlib
import importlib
import http.server
import json
import re
import threading

import pytest

from distattn.corpus import DownloadError, download

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/ok":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path == "/cut":   # promises 1 MiB, sends half, then closes
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.wfile.flush()
            self.connection.close()
        elif self.path == "/cut-chunked":   # chunked: announces a 1 KiB chunk, sends half, then closes
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"400\r\n" + b"x" * 0x200)
            self.wfile.flush()
            self.connection.close()
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


PARTIAL = ["f.bin.part", "f.bin.part.json"]   # what an interrupted download leaves, to resume


def leftovers(d):
    return sorted(p.name for p in d.iterdir())


def test_download_ok_with_checksum(server, tmp_path):
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    out = download(server + "/ok", tmp_path / "f.bin", sha256=["0" * 64, sha], size=[len(PAYLOAD)], progress=True)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("path, kw, match", [
    ("/ok", {"sha256": ["0" * 64]}, "has sha256 .* expected one of"),
    ("/ok", {"size": [5]}, "has 1048576 bytes; expected one of"),
    ("/cut", {}, "broke off|bytes; expected|IncompleteRead|Connection"),
    ("/missing", {}, "could not download"),
])
def test_failed_downloads_leave_nothing(server, tmp_path, path, kw, match):
    kw.setdefault("size", [len(PAYLOAD)])
    with pytest.raises(DownloadError, match=match):
        download(server + path, tmp_path / "f.bin", progress=False, **kw)
    # a body cut short is kept beside dest, to be resumed; a wrong or missing file leaves nothing
    assert leftovers(tmp_path) == (PARTIAL if path == "/cut" else [])


def test_existing_file_survives_failed_download(server, tmp_path):
    (tmp_path / "f.bin").write_bytes(b"old")
    with pytest.raises(DownloadError):
        download(server + "/ok", tmp_path / "f.bin", sha256=["0" * 64], progress=False)
    assert (tmp_path / "f.bin").read_bytes() == b"old" and leftovers(tmp_path) == ["f.bin"]


def test_unreachable(tmp_path):
    with pytest.raises(DownloadError, match="could not download http://127.0.0.1:9/"):
        download("http://127.0.0.1:9/x", tmp_path / "f", progress=False, timeout=5)


@pytest.mark.parametrize("path", ["/cut", "/cut-chunked"])
def test_body_cut_short_is_refused_without_size_or_checksum(server, tmp_path, path):
    # urllib's read(amt) returns b"" when the server closes before Content-Length bytes instead of
    # raising: the half body was renamed onto dest when no size or sha256 was given; a cut chunked
    # body raised http.client.IncompleteRead, not DownloadError
    with pytest.raises(DownloadError, match="broke off"):
        download(server + path, tmp_path / "f.bin", progress=False)
    assert not (tmp_path / "f.bin").exists() and set(leftovers(tmp_path)) <= set(PARTIAL)


def test_one_checksum_or_size_may_be_given_alone(server, tmp_path):
    # a single sha256 string was read as 64 one-character checksums (every download refused, "expected
    # one of ['0', '1', ...]"), and a single size raised a bare "'int' object is not iterable"
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    out = download(server + "/ok", tmp_path / "f.bin", sha256=sha.upper(), size=len(PAYLOAD), progress=False)
    assert out.read_bytes() == PAYLOAD
    with pytest.raises(DownloadError, match=f"expected one of \\['{'0' * 64}'\\]"):
        download(server + "/ok", tmp_path / "g.bin", sha256="0" * 64, progress=False)
    with pytest.raises(DownloadError, match=r"expected one of \[5\]"):
        download(server + "/ok", tmp_path / "g.bin", size=5, progress=False)
    assert leftovers(tmp_path) == ["f.bin"]


OTHER = bytes(reversed(range(256))) * 4096


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """/ranged* honour ``Range: bytes=N-``, /plain ignores it, /badrange answers 206 with a range
    that starts at 0 whatever was asked, /shortlen a 206 whose Content-Length is half its
    Content-Range, /first100 and /wrong206 answer a request without Range with a 206 of 100 bytes
    (from byte 0 and from byte 100). ``cut[path] = K`` cuts the next response after K bytes. Every
    200 and 206 has a Last-Modified (which lets a partial file be resumed without a sha256), except
    on /unvalidated."""
    served = []   # (path, Range header, body bytes the response holds), one per request
    cut = {}
    version = 1
    arrived, gate = threading.Event(), threading.Event()   # /gated: a request came; let its body go

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = OTHER if self.path == "/ranged-other" else PAYLOAD
        if self.path in ("/changing", "/unvalidated"):   # version 2 serves OTHER
            body = PAYLOAD if self.version == 1 else OTHER
        rng = self.headers.get("Range")
        start = 0
        if self.path in ("/first100", "/wrong206") and not rng:   # 206 to a request without Range
            lo = 0 if self.path == "/first100" else 100
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{lo + 99}/{len(body)}")
            self.send_header("Content-Length", "100")
            self.served.append((self.path, rng, 100))
            self.end_headers()
            self.wfile.write(body[lo:lo + 100])
            return
        if rng and self.path != "/plain":
            start = 0 if self.path == "/badrange" else int(re.fullmatch(r"bytes=(\d+)-", rng)[1])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.served.append((self.path, rng, 0))
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        if self.path == "/changing":
            self.send_header("ETag", f'"v{self.version}"')
        if self.path != "/unvalidated":
            self.send_header("Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT")
        chunk = body[start:]
        if rng and self.path == "/shortlen":   # Content-Length shorter than its Content-Range says
            chunk = chunk[: len(chunk) // 2]
        self.send_header("Content-Length", str(len(chunk)))
        k = self.cut.pop(self.path, None)
        sent = chunk[:k] if k is not None else chunk
        # recorded before the headers go out, so in request order: a client that drops a response it
        # refuses (a mismatched Content-Range) breaks the pipe mid-write, and the record must not be lost with it
        self.served.append((self.path, rng, len(sent)))
        self.end_headers()
        if self.path == "/gated":
            self.arrived.set()
            self.gate.wait()
        try:
            self.wfile.write(sent)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        if k is not None:
            self.connection.close()


@pytest.fixture
def rserver():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    RangeHandler.served.clear()
    RangeHandler.cut.clear()
    RangeHandler.version = 1
    RangeHandler.arrived.clear()
    RangeHandler.gate.clear()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    RangeHandler.gate.set()
    srv.shutdown()
    srv.server_close()


def interrupt(url, dest, k):
    """A first download of ``url`` cut after ``k`` bytes: its partial file stays beside ``dest``."""
    RangeHandler.cut["/" + url.rsplit("/", 1)[1]] = k
    with pytest.raises(DownloadError, match=f"broke off after {k} of the {len(PAYLOAD)} bytes.*kept in"):
        download(url, dest, progress=False)
    assert leftovers(dest.parent) == PARTIAL and (dest.parent / PARTIAL[0]).stat().st_size == k
    RangeHandler.served.clear()


SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_interrupted_download_resumes_with_only_the_remainder(rserver, tmp_path):
    # an interrupted download started again from byte 0, and kept nothing of what it had received
    interrupt(rserver + "/ranged", tmp_path / "f.bin", 300_000)
    out = download(rserver + "/ranged", tmp_path / "f.bin", sha256=SHA, size=len(PAYLOAD), progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served == [("/ranged", "bytes=300000-", len(PAYLOAD) - 300_000)]


def test_server_without_range_support_restarts_from_zero(rserver, tmp_path):
    interrupt(rserver + "/plain", tmp_path / "f.bin", 300_000)
    out = download(rserver + "/plain", tmp_path / "f.bin", sha256=SHA, progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served == [("/plain", "bytes=300000-", len(PAYLOAD))]


def test_mismatched_content_range_restarts_cleanly(rserver, tmp_path):
    interrupt(rserver + "/badrange", tmp_path / "f.bin", 300_000)
    out = download(rserver + "/badrange", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served == [("/badrange", "bytes=300000-", len(PAYLOAD)), ("/badrange", None, len(PAYLOAD))]


def test_unsatisfiable_range_restarts_cleanly(rserver, tmp_path):
    interrupt(rserver + "/ranged", tmp_path / "f.bin", 300_000)
    with open(tmp_path / "f.bin.part", "ab") as fh:     # longer than the file: 416
        fh.write(b"x" * len(PAYLOAD))
    out = download(rserver + "/ranged", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    n = 300_000 + len(PAYLOAD)
    assert RangeHandler.served == [("/ranged", f"bytes={n}-", 0), ("/ranged", None, len(PAYLOAD))]


def test_corrupt_partial_is_discarded_not_resumed_forever(rserver, tmp_path):
    interrupt(rserver + "/ranged", tmp_path / "f.bin", 300_000)
    with open(tmp_path / "f.bin.part", "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\xff")
    with pytest.raises(DownloadError, match="has sha256 .* expected one of .*nothing was kept"):
        download(rserver + "/ranged", tmp_path / "f.bin", sha256=SHA, progress=False)
    assert leftovers(tmp_path) == []
    RangeHandler.served.clear()
    out = download(rserver + "/ranged", tmp_path / "f.bin", sha256=SHA, progress=False)
    assert out.read_bytes() == PAYLOAD and RangeHandler.served == [("/ranged", None, len(PAYLOAD))]


def test_partial_of_another_url_is_not_resumed(rserver, tmp_path):
    # without a checksum, appending the rest of one file to the start of another would go unnoticed
    interrupt(rserver + "/ranged-other", tmp_path / "f.bin", 300_000)
    out = download(rserver + "/ranged", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == PAYLOAD and RangeHandler.served == [("/ranged", None, len(PAYLOAD))]


def test_empty_file_downloads_to_an_empty_dest(tmp_path):
    # the partial file of a zero-byte download was discarded as 'nothing arrived' and the rename failed
    src = tmp_path / "empty.bin"
    src.write_bytes(b"")
    dest = download(src.as_uri(), tmp_path / "out" / "empty.bin", sha256=hashlib.sha256(b"").hexdigest(),
                    progress=False)
    assert dest.read_bytes() == b""
    assert sorted(p.name for p in dest.parent.iterdir()) == ["empty.bin"]


def test_partial_answer_with_a_short_content_length_is_not_taken_for_the_rest(rserver, tmp_path):
    # a 206 whose Content-Length (the bytes it holds) is less than its Content-Range announces was
    # appended and, its Content-Length all read, the truncated file was renamed onto dest
    interrupt(rserver + "/shortlen", tmp_path / "f.bin", 300_000)
    out = download(rserver + "/shortlen", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    half = (len(PAYLOAD) - 300_000) // 2
    assert RangeHandler.served == [("/shortlen", "bytes=300000-", half), ("/shortlen", None, len(PAYLOAD))]


def test_partial_answer_to_a_request_for_the_whole_file_is_not_taken_for_it(rserver, tmp_path):
    # a 206 (its first 100 bytes) to a request without Range was renamed onto dest as the whole file
    with pytest.raises(DownloadError, match=f"broke off after 100 of the {len(PAYLOAD)} bytes.*kept in"):
        download(rserver + "/first100", tmp_path / "f.bin", progress=False)
    assert leftovers(tmp_path) == PARTIAL and (tmp_path / "f.bin.part").read_bytes() == PAYLOAD[:100]
    out = download(rserver + "/first100", tmp_path / "f.bin", sha256=SHA, progress=False)   # resumes
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    with pytest.raises(DownloadError, match="206 .*Content-Range 'bytes 100-199/.* nothing was kept"):
        download(rserver + "/wrong206", tmp_path / "g.bin", progress=False)
    assert leftovers(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("checks", [{"sha256": SHA}, {"size": len(PAYLOAD)}, {}])
def test_a_download_that_waited_for_another_to_the_same_dest_takes_its_file(rserver, tmp_path, monkeypatch,
                                                                             checks):
    # the call that waited on the lock found the partial file renamed away and downloaded the whole
    # file again; it now takes the other's file if it passes its own checks (without any check,
    # nothing tells that the other fetched the same URL: it downloads again)
    dl = importlib.import_module("distattn.corpus.download")   # the package exports the function of that name
    real, waiting = dl.fcntl, threading.Event()

    class Flock:                                    # tells when the second download asks for the lock
        def __getattr__(self, name):
            return getattr(real, name)

        def flock(self, fd, op):
            if threading.current_thread().name == "second":
                waiting.set()
            return real.flock(fd, op)

    monkeypatch.setattr(dl, "fcntl", Flock())
    url, dest, results = rserver + "/gated", tmp_path / "f.bin", {}

    def run(name, **kw):
        try:
            results[name] = download(url, dest, progress=False, **kw)
        except BaseException as exc:
            results[name] = exc

    first = threading.Thread(target=run, args=("first",), kwargs={"sha256": SHA})
    first.start()
    assert RangeHandler.arrived.wait(60)            # the first holds the lock
    second = threading.Thread(target=run, args=("second",), kwargs=checks, name="second")
    second.start()
    assert waiting.wait(60)
    RangeHandler.gate.set()
    first.join(60)
    second.join(60)
    assert results == {"first": dest, "second": dest} and dest.read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["f.bin"]
    assert len(RangeHandler.served) == (1 if checks else 2)


def test_an_unwritable_destination_is_a_download_error_naming_the_path(tmp_path):
    # a raw OSError escaped, so fetch_imdb (which catches DownloadError) gave none of its advice
    src = tmp_path / "src.bin"
    src.write_bytes(b"abc")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DownloadError, match=r"cannot create the folder .*afile"):
        download(src.as_uri(), tmp_path / "afile" / "out.bin", progress=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "out.bin.part").mkdir()          # in the way of the partial file
    with pytest.raises(DownloadError, match=r"cannot write the download's partial file .*out\.bin\.part"):
        download(src.as_uri(), tmp_path / "d" / "out.bin", progress=False)
    assert not (tmp_path / "d" / "out.bin").exists()


def test_a_partial_that_is_already_whole_is_not_downloaded_again(rserver, tmp_path):
    # a crash between the last byte and the rename: the resume's 416 ("bytes */N", N = what we hold)
    # restarted the whole download from byte 0
    interrupt(rserver + "/ranged", tmp_path / "f.bin", 300_000)
    with open(tmp_path / "f.bin.part", "ab") as fh:
        fh.write(PAYLOAD[300_000:])
    out = download(rserver + "/ranged", tmp_path / "f.bin", sha256=SHA, progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served == [("/ranged", f"bytes={len(PAYLOAD)}-", 0)]


def test_a_changed_file_is_not_spliced_when_the_server_ignores_if_range(rserver, tmp_path):
    # the 206's ETag was never compared with the partial's: the start of one file got the rest of another
    interrupt(rserver + "/changing", tmp_path / "f.bin", 300_000)
    RangeHandler.version = 2
    out = download(rserver + "/changing", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == OTHER
    assert [r[:2] for r in RangeHandler.served] == [("/changing", "bytes=300000-"), ("/changing", None)]



def test_a_changed_file_is_not_spliced_when_the_server_sends_no_validator(rserver, tmp_path):
    # without ETag or Last-Modified (and no sha256) the partial was resumed on the length alone: the
    # start of one file got the rest of another file of the same length, and no check saw it
    interrupt(rserver + "/unvalidated", tmp_path / "f.bin", 300_000)
    RangeHandler.version = 2
    out = download(rserver + "/unvalidated", tmp_path / "f.bin", size=len(OTHER), progress=False)
    assert out.read_bytes() == OTHER and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served == [("/unvalidated", None, len(OTHER))]
    # with a sha256 a splice cannot go unnoticed: the partial is resumed
    interrupt(rserver + "/unvalidated", tmp_path / "again" / "f.bin", 300_000)
    out = download(rserver + "/unvalidated", tmp_path / "again" / "f.bin",
                   sha256=hashlib.sha256(OTHER).hexdigest(), progress=False)
    assert out.read_bytes() == OTHER
    assert RangeHandler.served == [("/unvalidated", "bytes=300000-", len(OTHER) - 300_000)]


def test_a_break_off_without_a_validator_does_not_promise_a_resume(rserver, tmp_path):
    # the message said "the next call resumes from there", but without ETag, Last-Modified or a sha256
    # the next call starts again from byte 0
    RangeHandler.cut["/unvalidated"] = 300_000
    with pytest.raises(DownloadError, match="broke off after 300000") as info:
        download(rserver + "/unvalidated", tmp_path / "f.bin", progress=False)
    assert "resumes from there" not in str(info.value) and "again from the start" in str(info.value)
    RangeHandler.cut["/ranged"] = 300_000        # with a validator, the promise holds
    with pytest.raises(DownloadError, match="kept in .* and the next call resumes from there"):
        download(rserver + "/ranged", tmp_path / "g.bin", progress=False)
    RangeHandler.cut["/unvalidated"] = 300_000   # and with a sha256
    with pytest.raises(DownloadError, match="kept in .* and the next call resumes from there"):
        download(rserver + "/unvalidated", tmp_path / "h.bin", sha256=hashlib.sha256(PAYLOAD).hexdigest(),
                 progress=False)


@pytest.mark.parametrize("garble", ["cut short", "length changed"])
def test_a_damaged_part_json_restarts_the_download_not_splices_it(rserver, tmp_path, garble):
    """The resume state beside an interrupted download (``f.bin.part.json``) is not sealed: a damaged
    one must lead to a download from byte 0, never to bytes appended on a wrong assumption. No
    checksum is given, so only the resume logic stands between a damaged state and a wrong file."""
    interrupt(rserver + "/ranged", tmp_path / "f.bin", 300_000)
    meta = tmp_path / PARTIAL[1]
    text = meta.read_text()
    if garble == "cut short":       # invalid JSON: no state, so no URL to match
        meta.write_text(text[:len(text) // 2])
    else:                           # valid JSON, a digit of the file's length changed
        state = json.loads(text)
        state["length"] += 10
        meta.write_text(json.dumps(state))
    out = download(rserver + "/ranged", tmp_path / "f.bin", progress=False)
    assert out.read_bytes() == PAYLOAD and leftovers(tmp_path) == ["f.bin"]
    assert RangeHandler.served[-1] == ("/ranged", None, len(PAYLOAD))
