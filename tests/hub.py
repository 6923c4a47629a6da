"""Stand-ins for the Hugging Face Hub and for a plain HTTP file server, on 127.0.0.1.

    from tests.hub import hub_fixture, serve_files, stand_in_hub

    with stand_in_hub(datasets={"me/tiny": {"data/train.jsonl": b'{"text": "hi"}\\n'}}) as hub:
        ...  # HF_ENDPOINT and huggingface_hub's constants point at the stand-in
        hub.add("me/tiny", {...})          # a new commit on main; old shas still resolve
        hub.interrupt("train.jsonl", after_bytes=100, mode="close")  # or "stall"

The hub serves what huggingface_hub (2.x, httpx2) calls, checked against its source:
  GET  /api/{datasets,models}/{repo}[/revision/{rev}]   repo info (sha, siblings with size,
       blobId and lfs when ?blobs=True, cardData from README.md's YAML header)
  GET  /api/{datasets,models}/{repo}/tree/{rev}[/{path}]  (snapshot_download's listing)
  HEAD/GET /[datasets/]{repo}/resolve/{rev}/{path}      ETag, X-Repo-Commit, Content-Length,
       Range; LFS files (by suffix, as the hub's default .gitattributes) answer with a 302 to
       a second server (another origin, as the hub's CDN) and X-Linked-Etag/X-Linked-Size
Unknown repos, revisions and files get 404 with the hub's X-Error-Code (RepoNotFound,
RevisionNotFound, EntryNotFound), so huggingface_hub raises its own errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import hashlib
import http.server
import json
import os
import re
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

LFS_SUFFIXES = (".parquet", ".gz", ".zst", ".bin", ".arrow", ".safetensors", ".tar")
"""Files the stand-in stores in LFS, as the hub's default .gitattributes does."""


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclasses.dataclass
class Interruption:
    """Serve `after_bytes` of a matching file's body, then close the connection ("close")
    or hold it open until `release` is set ("stall"); `reached` is set when it happens."""

    name: str
    after_bytes: int
    mode: str = "close"
    times: int = 1
    reached: threading.Event = dataclasses.field(default_factory=threading.Event)
    release: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: Any
    """The request's headers (an email.message.Message: `.get(name)` ignores case)."""


class _Server:
    """A threaded HTTP server whose handler calls `route(handler)`; bodies go through `send`."""

    def __init__(self, route: Any):
        self.route = route
        self.requests: list[Request] = []
        self.interruptions: list[Interruption] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802
                outer._handle(self)

            def do_GET(self) -> None:  # noqa: N802
                outer._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self.requests.append(Request(handler.command, handler.path, handler.headers))
        try:
            self.route(handler)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close(self) -> None:
        for i in self.interruptions:
            i.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def send_body(
        self,
        handler: http.server.BaseHTTPRequestHandler,
        name: str,
        data: bytes,
        headers: Mapping[str, str],
        etag: str | None,
    ) -> None:
        """200 or 206 (a Range, honoured unless an If-Range names another ETag), with
        `headers`; the body may be cut short by an interruption matching `name`."""
        start = 0
        rng = handler.headers.get("Range")
        if_range = handler.headers.get("If-Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        partial = m is not None and (if_range is None or if_range == etag)
        if partial:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            body = data[start : end + 1]
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            body = data
            handler.send_response(200)
        for k, v in headers.items():
            handler.send_header(k, v)
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "HEAD":
            return
        cut = next((i for i in self.interruptions if i.times > 0 and name.endswith(i.name)), None)
        if cut is not None and start < cut.after_bytes < start + len(body):
            cut.times -= 1
            handler.wfile.write(body[: cut.after_bytes - start])
            handler.wfile.flush()
            cut.reached.set()
            if cut.mode == "stall":
                cut.release.wait(300)
            handler.close_connection = True
            return
        handler.wfile.write(body)


def _send_error(
    handler: http.server.BaseHTTPRequestHandler,
    status: int,
    code: str | None = None,
    message: str = "",
    extra: Mapping[str, str] | None = None,
) -> None:
    body = json.dumps({"error": message or code or "error"}).encode()
    handler.send_response(status)
    if code:
        handler.send_header("X-Error-Code", code)
    if message:
        handler.send_header("X-Error-Message", message)
    for k, v in (extra or {}).items():
        handler.send_header(k, v)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _send_json(handler: http.server.BaseHTTPRequestHandler, obj: Any) -> None:
    body = json.dumps(obj).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _card_data(readme: bytes | None) -> dict[str, Any] | None:
    """The YAML header of a README.md, as the hub returns it in cardData."""
    if not readme:
        return None
    text = readme.decode("utf-8")
    m = re.match(r"---\n(.*?)\n---", text, re.DOTALL)
    if not m:
        return None
    import yaml

    return yaml.safe_load(m.group(1)) or None


@dataclasses.dataclass
class _Repo:
    refs: dict[str, str] = dataclasses.field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = dataclasses.field(default_factory=dict)


class StandInHub:
    """A Hugging Face Hub on 127.0.0.1 serving in-memory repos; see the module docstring."""

    def __init__(self, lfs_suffixes: tuple[str, ...] = LFS_SUFFIXES):
        self.lfs_suffixes = lfs_suffixes
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._blobs: dict[str, bytes] = {}  # sha256 -> bytes, what the CDN serves
        self.server = _Server(self._route)
        self.cdn = _Server(self._route_cdn)
        self.endpoint = self.server.endpoint

    # -- the content ----------------------------------------------------------
    def add(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        repo_type: str = "dataset",
        branch: str = "main",
        tags: tuple[str, ...] = (),
    ) -> str:
        """Commit `files` (the whole tree) to `branch` of the repo (created if new); returns
        the commit sha. Earlier commits still resolve by sha."""
        repo = self._repos.setdefault((repo_type, repo_id), _Repo())
        tree = {path: bytes(data) for path, data in files.items()}
        listing = json.dumps(
            [[p, git_blob_sha1(d)] for p, d in sorted(tree.items())] + [len(repo.commits)]
        )
        sha = hashlib.sha1(listing.encode()).hexdigest()
        repo.commits[sha] = tree
        repo.refs[branch] = sha
        for tag in tags:
            repo.refs[tag] = sha
        for data in tree.values():
            self._blobs[hashlib.sha256(data).hexdigest()] = data
        return sha

    def interrupt(
        self, name: str, after_bytes: int, mode: str = "close", times: int = 1
    ) -> Interruption:
        """Cut the next `times` downloads of a file whose path ends with `name` after
        `after_bytes` bytes (see Interruption)."""
        cut = Interruption(name, after_bytes, mode, times)
        self.server.interruptions.append(cut)
        self.cdn.interruptions.append(cut)
        return cut

    @property
    def requests(self) -> list[Request]:
        """Every request the hub and its CDN received, in order per server (hub first)."""
        return self.server.requests + self.cdn.requests

    def close(self) -> None:
        self.server.close()
        self.cdn.close()

    # -- serving -------------------------------------------------------------
    def _is_lfs(self, path: str) -> bool:
        return path.lower().endswith(self.lfs_suffixes)

    def _commit(
        self, handler: Any, repo_type: str, repo_id: str, revision: str
    ) -> tuple[str, dict[str, bytes]] | None:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            _send_error(handler, 404, "RepoNotFound", "Repository not found")
            return None
        sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if sha is None:
            _send_error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return sha, repo.commits[sha]

    def _sibling(self, path: str, data: bytes, blobs: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"rfilename": path}
        if blobs:
            out["size"] = len(data)
            out["blobId"] = git_blob_sha1(data)
            if self._is_lfs(path):
                out["lfs"] = {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "pointerSize": 134,
                }
        return out

    def _route(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        path = url.path
        m = re.fullmatch(r"/api/(datasets|models)/(.+?)/tree/([^/]+)(/.*)?", path)
        if m:
            kind, repo_id, rev = m.group(1)[:-1], m.group(2), urllib.parse.unquote(m.group(3))
            found = self._commit(handler, kind, repo_id, rev)
            if found is None:
                return
            prefix = urllib.parse.unquote(m.group(4) or "").strip("/")
            entries = []
            for p, data in sorted(found[1].items()):
                if prefix and not p.startswith(prefix + "/"):
                    continue
                entry: dict[str, Any] = {
                    "type": "file",
                    "path": p,
                    "size": len(data),
                    "oid": git_blob_sha1(data),
                }
                if self._is_lfs(p):
                    entry["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                entries.append(entry)
            _send_json(handler, entries)
            return
        m = re.fullmatch(r"/api/(datasets|models)/(.+?)(?:/revision/([^/]+))?", path)
        if m:
            kind, repo_id = m.group(1)[:-1], m.group(2)
            rev = urllib.parse.unquote(m.group(3)) if m.group(3) else "main"
            found = self._commit(handler, kind, repo_id, rev)
            if found is None:
                return
            sha, tree = found
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            info: dict[str, Any] = {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0] if "/" in repo_id else None,
                "sha": sha,
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": [self._sibling(p, d, blobs) for p, d in sorted(tree.items())],
                "lastModified": "2026-01-01T00:00:00.000Z",
            }
            card = _card_data(tree.get("README.md"))
            if card is not None:
                info["cardData"] = card
            _send_json(handler, info)
            return
        m = re.fullmatch(r"/(datasets/)?(.+?)/resolve/([^/]+)/(.+)", path)
        if m:
            kind = "dataset" if m.group(1) else "model"
            repo_id, rev = m.group(2), urllib.parse.unquote(m.group(3))
            found = self._commit(handler, kind, repo_id, rev)
            if found is None:
                return
            sha, tree = found
            file_path = urllib.parse.unquote(m.group(4))
            if file_path not in tree:
                _send_error(
                    handler, 404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha}
                )
                return
            data = tree[file_path]
            if self._is_lfs(file_path):
                sha256 = hashlib.sha256(data).hexdigest()
                handler.send_response(302)
                handler.send_header("Location", f"{self.cdn.endpoint}/cdn/{sha256}")
                handler.send_header("X-Repo-Commit", sha)
                handler.send_header("X-Linked-Etag", f'"{sha256}"')
                handler.send_header("X-Linked-Size", str(len(data)))
                handler.send_header("ETag", f'"{git_blob_sha1(data)}"')
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            etag = f'"{git_blob_sha1(data)}"'
            self.server.send_body(
                handler, file_path, data, {"ETag": etag, "X-Repo-Commit": sha}, etag
            )
            return
        _send_error(handler, 404, None, f"no route {path}")

    def _route_cdn(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        m = re.fullmatch(r"/cdn/([0-9a-f]{64})", urllib.parse.urlsplit(handler.path).path)
        data = self._blobs.get(m.group(1)) if m else None
        if data is None:
            _send_error(handler, 404, None, "no such blob")
            return
        # the interruption matches by file name: find a path holding these bytes
        name = next(
            (
                p
                for repo in self._repos.values()
                for tree in repo.commits.values()
                for p, d in tree.items()
                if d is data or d == data
            ),
            m.group(1),
        )
        etag = f'"{m.group(1)}"'
        self.cdn.send_body(handler, name, data, {"ETag": etag}, etag)


def _point_huggingface_hub_at(endpoint: str, cache: str) -> dict[str, Any]:
    """Set HF_ENDPOINT (and huggingface_hub's constants, which it reads once at import);
    returns what to restore."""
    from huggingface_hub import constants

    saved_env = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HOME")}
    saved = {
        "ENDPOINT": constants.ENDPOINT,
        "HUGGINGFACE_CO_URL_TEMPLATE": constants.HUGGINGFACE_CO_URL_TEMPLATE,
        "HF_HUB_CACHE": constants.HF_HUB_CACHE,
        "HF_HUB_OFFLINE": constants.HF_HUB_OFFLINE,
    }
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HOME"] = cache
    os.environ.pop("HF_HUB_OFFLINE", None)
    constants.ENDPOINT = endpoint
    constants.HUGGINGFACE_CO_URL_TEMPLATE = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    constants.HF_HUB_CACHE = os.path.join(cache, "hub")
    constants.HF_HUB_OFFLINE = False
    return {"env": saved_env, "constants": saved}


def _restore(saved: dict[str, Any]) -> None:
    from huggingface_hub import constants

    for k, v in saved["env"].items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for k, v in saved["constants"].items():
        setattr(constants, k, v)


@contextlib.contextmanager
def stand_in_hub(
    datasets: Mapping[str, Mapping[str, bytes]] | None = None,
    models: Mapping[str, Mapping[str, bytes]] | None = None,
    *,
    lfs_suffixes: tuple[str, ...] = LFS_SUFFIXES,
) -> Iterator[StandInHub]:
    """A running StandInHub with `datasets` and `models` ({repo_id: {path: bytes}}) committed
    to main; HF_ENDPOINT, HF_HOME (a temporary cache) and huggingface_hub's constants point at
    it until the block ends."""
    hub = StandInHub(lfs_suffixes)
    for repo_id, files in (datasets or {}).items():
        hub.add(repo_id, files, repo_type="dataset")
    for repo_id, files in (models or {}).items():
        hub.add(repo_id, files, repo_type="model")
    with tempfile.TemporaryDirectory(prefix="stand-in-hub-") as cache:
        saved = _point_huggingface_hub_at(hub.endpoint, cache)
        try:
            yield hub
        finally:
            _restore(saved)
            hub.close()


@pytest.fixture(name="hub")
def hub_fixture() -> Iterator[StandInHub]:
    """The `hub` fixture: an empty stand-in hub (add repos with `hub.add(repo_id, {path:
    bytes})`). A test module enables it with `from tests.hub import hub_fixture  # noqa: F401`."""
    with stand_in_hub() as h:
        yield h


class FileServer:
    """Plain HTTP files (ETag, Last-Modified, Range with If-Range, 404) on 127.0.0.1."""

    def __init__(self, files: Mapping[str, bytes] | None = None):
        self.files: dict[str, bytes] = dict(files or {})
        self.server = _Server(self._route)
        self.endpoint = self.server.endpoint
        self._modified: dict[str, float] = {}

    def url(self, path: str) -> str:
        return f"{self.endpoint}/{path.lstrip('/')}"

    def put(self, path: str, data: bytes) -> None:
        self.files[path.lstrip("/")] = data
        self._modified[path.lstrip("/")] = time.time()

    def interrupt(
        self, name: str, after_bytes: int, mode: str = "close", times: int = 1
    ) -> Interruption:
        cut = Interruption(name, after_bytes, mode, times)
        self.server.interruptions.append(cut)
        return cut

    @property
    def requests(self) -> list[Request]:
        return self.server.requests

    def close(self) -> None:
        self.server.close()

    def _route(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path).lstrip("/")
        data = self.files.get(path)
        if data is None:
            _send_error(handler, 404, None, f"{path} not found")
            return
        etag = f'"{hashlib.md5(data).hexdigest()}"'
        modified = email.utils.formatdate(self._modified.get(path, 0), usegmt=True)
        self.server.send_body(handler, path, data, {"ETag": etag, "Last-Modified": modified}, etag)


@contextlib.contextmanager
def serve_files(files: Mapping[str, bytes] | None = None) -> Iterator[FileServer]:
    """A running FileServer serving `files` ({path: bytes}); `server.url(path)` is each URL."""
    server = FileServer(files)
    try:
        yield server
    finally:
        server.close()
