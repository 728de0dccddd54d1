import hashlib
import http.server
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
    assert leftovers(tmp_path) == []


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
    assert leftovers(tmp_path) == []


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
