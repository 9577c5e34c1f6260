"""An in-process stand-in for Google Cloud Storage, so `gs://` workdirs are tested without a
network: one object store with GCS's semantics (flat object names, no directories, no append,
an object appears whole when its upload completes, generation numbers), seen through

* an fsspec filesystem registered for the `gs`/`gcs` protocols, which is what `etils.epath`
  (and so our code and Orbax's metadata files) uses for `gs://` paths when TensorFlow is
  absent: it stands where `gcsfs` stands in production;
* a local HTTP server speaking the part of the GCS JSON API that TensorStore's `gcs` driver
  uses (Orbax writes array data through TensorStore, never through fsspec), selected with
  TensorStore's own `TENSORSTORE_GCS_HTTP_URL` and `GOOGLE_AUTH_TOKEN_FOR_TESTING`.

Both views share the one store, as both clients share one bucket in production. Tests use the
`fake_gcs` fixture (tests/conftest.py).
"""

from __future__ import annotations

import http.server
import io
import json
import threading
import urllib.parse
from collections import Counter

from fsspec.spec import AbstractFileSystem


class PreconditionFailedError(Exception):
    pass


class ObjectStore:
    """Objects by (bucket, name): bytes and a generation number, as GCS keeps them."""

    def __init__(self):
        self.objects: dict[tuple[str, str], tuple[bytes, int]] = {}
        self.requests: list[tuple[str, str]] = []  # (client, operation) for assertions
        self.uploads: Counter[str] = Counter()  # fsspec uploads per object name
        self._lock = threading.Lock()
        self._generation = 0

    def get(self, bucket: str, name: str) -> tuple[bytes, int] | None:
        with self._lock:
            return self.objects.get((bucket, name))

    def put(self, bucket: str, name: str, data: bytes, if_generation_match: int | None = None):
        with self._lock:
            have = self.objects.get((bucket, name))
            if if_generation_match is not None and (have[1] if have else 0) != if_generation_match:
                raise PreconditionFailedError(name)
            self._generation += 1
            self.objects[(bucket, name)] = (bytes(data), self._generation)
            return self._generation

    def delete(self, bucket: str, name: str, if_generation_match: int | None = None) -> bool:
        with self._lock:
            have = self.objects.get((bucket, name))
            if have is None:
                return False
            if if_generation_match is not None and have[1] != if_generation_match:
                raise PreconditionFailedError(name)
            del self.objects[(bucket, name)]
            return True

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix))

    # Test helpers, by URL (gs://bucket/name).

    def read(self, url: str) -> bytes:
        """The object's bytes (KeyError if absent)."""
        found = self.get(*_split(FakeGCSFileSystem._strip_protocol(url)))
        if found is None:
            raise KeyError(url)
        return found[0]

    def text(self, url: str) -> str:
        return self.read(url).decode()

    def listing(self, url: str) -> list[str]:
        """Names of the objects under the folder `url`, relative to it."""
        bucket, name = _split(FakeGCSFileSystem._strip_protocol(url))
        return [n[len(name) + 1 :] for n in self.names(bucket, f"{name}/")]

    def overwrite(self, url: str, data: bytes) -> None:
        self.put(*_split(FakeGCSFileSystem._strip_protocol(url)), data)


# The store the fsspec filesystem and the HTTP server currently serve (set by the fixture).
CURRENT = {"store": ObjectStore()}


def _store() -> ObjectStore:
    return CURRENT["store"]


def _split(path: str) -> tuple[str, str]:
    bucket, _, name = path.partition("/")
    return bucket, name


class _Upload(io.BytesIO):
    """A file being written: nothing is visible until close, then the object appears whole."""

    def __init__(self, bucket: str, name: str):
        super().__init__()
        self._target = (bucket, name)

    def close(self):
        if not self.closed:
            _store().put(*self._target, self.getvalue())
            _store().requests.append(("fsspec", "put"))
            _store().uploads[self._target[1]] += 1
        super().close()


class FakeGCSFileSystem(AbstractFileSystem):
    """fsspec view of the store, with paths `bucket/name` like gcsfs. Buckets always exist;
    a "directory" exists while some object name has it as a prefix, as on GCS."""

    protocol = ("gs", "gcs")
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for p in ("gs://", "gcs://"):
            if path.startswith(p):
                path = path[len(p) :]
        return path.strip("/")

    def _entries(self, path: str) -> tuple[list[dict], bool]:
        bucket, name = _split(path)
        prefix = f"{name}/" if name else ""
        files, dirs = [], set()
        for n in _store().names(bucket, prefix):
            rest = n[len(prefix) :]
            if "/" in rest:
                dirs.add(rest.split("/", 1)[0])
            else:
                files.append({"name": f"{bucket}/{n}", "size": len(_store().get(bucket, n)[0]),
                              "type": "file"})  # fmt: skip
        out = files + [{"name": f"{path}/{d}", "size": 0, "type": "directory"} for d in dirs]
        return sorted(out, key=lambda e: e["name"]), bool(out)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        bucket, name = _split(path)
        if name and _store().get(bucket, name) is not None:
            out = [self.info(path)]
        else:
            out, found = self._entries(path)
            if not found and name:
                raise FileNotFoundError(path)
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        bucket, name = _split(path)
        found = _store().get(bucket, name) if name else None
        if found is not None:
            return {"name": path, "size": len(found[0]), "type": "file"}
        if not name or _store().names(bucket, f"{name}/"):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def _open(self, path, mode="rb", **kwargs):
        bucket, name = _split(self._strip_protocol(path))
        if "a" in mode or "+" in mode:
            raise NotImplementedError(f"object stores cannot open {path} in mode {mode!r}")
        if "w" in mode:
            return _Upload(bucket, name)
        found = _store().get(bucket, name)
        if found is None:
            raise FileNotFoundError(path)
        _store().requests.append(("fsspec", "get"))
        return io.BytesIO(found[0])

    def mkdir(self, path, create_parents=True, **kwargs):
        pass  # no directories on GCS

    def makedirs(self, path, exist_ok=False):
        pass

    def rmdir(self, path):
        pass

    def cp_file(self, path1, path2, **kwargs):
        src = _split(self._strip_protocol(path1))
        found = _store().get(*src)
        if found is None:
            raise FileNotFoundError(path1)
        _store().put(*_split(self._strip_protocol(path2)), found[0])

    def rm_file(self, path):
        if not _store().delete(*_split(self._strip_protocol(path))):
            raise FileNotFoundError(path)

    def rm(self, path, recursive=False, maxdepth=None):
        path = self._strip_protocol(path)
        bucket, name = _split(path)
        if _store().delete(bucket, name):
            return
        under = _store().names(bucket, f"{name}/")
        if not under:
            raise FileNotFoundError(path)
        if not recursive:
            raise IsADirectoryError(path)
        for n in under:
            _store().delete(bucket, n)


class _JsonApi(http.server.BaseHTTPRequestHandler):
    """The GCS JSON API calls TensorStore makes: media upload, read (whole, ranged, or
    metadata only), delete, list; with the generation preconditions it sends."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: bytes = b"", headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._reply(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _parse(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.split("/")  # '', [upload,] storage, v1, b, BUCKET, o[, OBJECT]
        if parts[1] == "upload":
            parts = parts[1:]
        bucket = urllib.parse.unquote(parts[4])
        name = urllib.parse.unquote("/".join(parts[6:])) if len(parts) > 6 else None
        return bucket, name, query

    @staticmethod
    def _generation(query, key):
        return int(query[key]) if key in query else None

    def _resource(self, bucket, name, data, generation) -> dict:
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)),
                "generation": str(generation), "metageneration": "1"}  # fmt: skip

    def do_POST(self):
        bucket, _, query = self._parse()
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        name = query["name"]
        _store().requests.append(("tensorstore", "put"))
        try:
            gen = _store().put(bucket, name, data, self._generation(query, "ifGenerationMatch"))
        except PreconditionFailedError:
            return self._json(412, {"error": {"code": 412, "message": "precondition"}})
        self._json(200, self._resource(bucket, name, data, gen))

    def do_GET(self):
        bucket, name, query = self._parse()
        if name is None:
            return self._list(bucket, query)
        _store().requests.append(("tensorstore", "get"))
        found = _store().get(bucket, name)
        if found is None:
            return self._json(404, {"error": {"code": 404, "message": "not found"}})
        data, gen = found
        match = self._generation(query, "ifGenerationMatch")
        if match is not None and match != gen:
            return self._json(412, {"error": {"code": 412, "message": "precondition"}})
        if self._generation(query, "ifGenerationNotMatch") == gen:
            return self._reply(304, headers={"x-goog-generation": str(gen)})
        if query.get("alt") != "media":
            return self._json(200, self._resource(bucket, name, data, gen))
        headers = {"x-goog-generation": str(gen), "Content-Type": "application/octet-stream"}
        rng = self.headers.get("Range")
        if rng:
            lo, _, hi = rng.removeprefix("bytes=").partition("-")
            lo, hi = int(lo), min(int(hi) if hi else len(data) - 1, len(data) - 1)
            headers["Content-Range"] = f"bytes {lo}-{hi}/{len(data)}"
            return self._reply(206, data[lo : hi + 1], headers)
        self._reply(200, data, headers)

    def _list(self, bucket, query):
        names = _store().names(bucket, query.get("prefix", ""))
        lo, hi = query.get("startOffset"), query.get("endOffset")
        names = [n for n in names if (lo is None or n >= lo) and (hi is None or n < hi)]
        items = [{"name": n, "size": str(len(_store().get(bucket, n)[0]))} for n in names]
        self._json(200, {"kind": "storage#objects", "items": items})

    def do_DELETE(self):
        bucket, name, query = self._parse()
        _store().requests.append(("tensorstore", "delete"))
        try:
            ok = _store().delete(bucket, name, self._generation(query, "ifGenerationMatch"))
        except PreconditionFailedError:
            return self._json(412, {"error": {"code": 412, "message": "precondition"}})
        if not ok:
            return self._json(404, {"error": {"code": 404, "message": "not found"}})
        self._reply(204)


def start_server() -> http.server.ThreadingHTTPServer:
    """The JSON API on a free loopback port, served by a daemon thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonApi)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
