"""A fake GitHub REST API (Git Data endpoints) on loopback, for the blog bot's tests, which must
never call GitHub (test support of this example, not part of the ``telegram_idem`` package).

`FakeGitHub` is an aiohttp web server bound to ``127.0.0.1`` on a free port that serves one
repository, closely enough for PyGithub to read and write it through the Git Data API:

* ``GET  /repos/{owner}/{repo}``
* ``GET  /repos/{owner}/{repo}/git/ref/{ref}`` and ``GET .../git/refs/{ref}``
* ``PATCH /repos/{owner}/{repo}/git/refs/{ref}`` (``force`` false: fast-forward only, else 422)
* ``POST /repos/{owner}/{repo}/git/refs``
* ``GET  /repos/{owner}/{repo}/git/commits/{sha}``, ``POST .../git/commits``
* ``GET  /repos/{owner}/{repo}/git/trees/{sha}[?recursive=1]``, ``POST .../git/trees``
  (``base_tree``; entries with ``content``, a blob ``sha``, or ``sha: null`` to delete)
* ``GET  /repos/{owner}/{repo}/git/blobs/{sha}``, ``POST .../git/blobs``

Objects are stored in memory and named by real git object ids (SHA-1 of the git encoding), so
an unchanged tree keeps its sha. Errors have GitHub's shape (``{"message": ...,
"documentation_url": ...}``) and the statuses GitHub documents: 401 for a wrong token, 404 for an
unknown object, 422 for a tree entry with both or neither of ``sha``/``content``, for deleting
a path absent from ``base_tree`` (``GitRPC::BadObjectState``) and for a non-fast-forward ref
update. Any other route answers 404 and is listed in `FakeGitHub.unhandled`.

Use it with PyGithub::

    async with FakeGitHub(files={"README.md": "hi"}) as gh:
        client = Github(auth=Auth.Token(gh.token), base_url=gh.url)
        repo = client.get_repo(gh.full_name)   # blocking: call from a thread

Deliberate simplifications: one repository; only ``blob`` tree entries can be written (no
submodules, no grafting a subtree by sha); commit dates come from a counter starting at
2026-01-01T00:00:00Z (one second per commit), so shas are reproducible.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from telegram_idem.testing import LoopbackServer

__all__ = ["FakeGitHub", "RecordedRequest"]

DOCS = "https://docs.github.com/rest"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_FILE_MODES = frozenset({"100644", "100755", "120000"})
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request the fake received.

    ``path`` excludes the query string (in ``query``); ``body`` is the decoded JSON body or
    ``None``; ``status`` is the status the fake answered.
    """

    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorization: str | None
    status: int
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Commit:
    tree: str
    parents: tuple[str, ...]
    message: str
    author: dict[str, str]
    committer: dict[str, str]


@dataclass(frozen=True)
class _TreeEntry:
    name: str
    mode: str  # as in git objects: "100644", "40000", ...
    type: str  # "blob" | "tree"
    sha: str


@dataclass(frozen=True)
class _Fault:
    method: str
    path_suffix: str
    status: int
    message: str


class _APIError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _git_sha(kind: str, data: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


class FakeGitHub(LoopbackServer):
    """Loopback stand-in for ``https://api.github.com`` serving one repository.

    Args:
        owner: repository owner login.
        repo: repository name.
        token: the only token accepted (``Authorization: token <t>`` or ``Bearer <t>``).
        branch: default branch, created with one initial commit holding ``files``.
        files: path → content (``str`` is UTF-8 encoded) of the initial commit.

    Attributes:
        requests: every request received, in order.
        unhandled: ``"METHOD /path"`` of requests no route served.
    """

    def __init__(
        self,
        *,
        owner: str = "octo",
        repo: str = "blog",
        token: str = "test-token",
        branch: str = "main",
        files: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__()
        self.owner = owner
        self.repo = repo
        self.token = token
        self.default_branch = branch
        self.requests: list[RecordedRequest] = []
        self.unhandled: list[str] = []
        self._blobs: dict[str, bytes] = {}
        self._trees: dict[str, tuple[_TreeEntry, ...]] = {EMPTY_TREE: ()}
        self._commits: dict[str, _Commit] = {}
        self._refs: dict[str, str] = {}
        self._clock = 0
        self._faults: deque[_Fault] = deque()
        self._hooks: list[tuple[str, str, Callable[[], object]]] = []
        tree = self._store_flat(
            {path: ("100644", self._store_blob(_bytes(c))) for path, c in (files or {}).items()}
        )
        self._refs[f"refs/heads/{branch}"] = self._store_commit(tree, (), "Initial commit\n", None)

    # ----------------------------------------------------------------- lifecycle

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=100 * 1024 * 1024)
        base = "/repos/{owner}/{repo}"
        routes = [
            ("GET", base, self._get_repo),
            ("GET", base + "/git/ref/{ref:.+}", self._get_ref),
            ("GET", base + "/git/refs/{ref:.+}", self._get_ref),
            ("PATCH", base + "/git/refs/{ref:.+}", self._update_ref),
            ("POST", base + "/git/refs", self._create_ref),
            ("GET", base + "/git/commits/{sha}", self._get_commit),
            ("POST", base + "/git/commits", self._create_commit),
            ("GET", base + "/git/trees/{sha}", self._get_tree),
            ("POST", base + "/git/trees", self._create_tree),
            ("GET", base + "/git/blobs/{sha}", self._get_blob),
            ("POST", base + "/git/blobs", self._create_blob),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    @property
    def full_name(self) -> str:
        """``"owner/repo"``."""
        return f"{self.owner}/{self.repo}"

    # ----------------------------------------------------------------- test controls

    def head(self, branch: str | None = None) -> str:
        """Commit sha of ``branch`` (default branch when ``None``). Raises `KeyError`."""
        return self._refs[f"refs/heads/{branch or self.default_branch}"]

    def log(self, branch: str | None = None) -> list[str]:
        """Commit shas of the branch's first-parent chain, newest first."""
        shas: list[str] = []
        sha: str | None = self.head(branch)
        while sha is not None:
            shas.append(sha)
            parents = self._commits[sha].parents
            sha = parents[0] if parents else None
        return shas

    def tree_sha(self, commit: str | None = None) -> str:
        """Root tree sha of ``commit`` (default: the default branch's head)."""
        return self._commits[commit or self.head()].tree

    def commit_message(self, sha: str) -> str:
        """Message of commit ``sha``."""
        return self._commits[sha].message

    def files(self, commit: str | None = None) -> dict[str, bytes]:
        """path → bytes of every blob in ``commit`` (default: the default branch's head)."""
        tree = self._commits[commit or self.head()].tree
        return {path: self._blobs[sha] for path, (_, sha) in self._flatten(tree).items()}

    def text_files(self, commit: str | None = None) -> dict[str, str]:
        """As :meth:`files`, decoded as UTF-8 (undecodable bytes replaced)."""
        return {p: b.decode("utf-8", "replace") for p, b in self.files(commit).items()}

    def changed_paths(self, commit: str) -> set[str]:
        """Paths added, modified or deleted by ``commit`` relative to its first parent."""
        parents = self._commits[commit].parents
        after = self._flatten(self._commits[commit].tree)
        before = self._flatten(self._commits[parents[0]].tree) if parents else {}
        return {
            path for path in after.keys() | before.keys() if after.get(path) != before.get(path)
        }

    def push(
        self,
        changes: Mapping[str, str | bytes | None],
        message: str = "Direct push\n",
        branch: str | None = None,
    ) -> str:
        """Commit ``changes`` (path → content, ``None`` deletes) on top of ``branch``.

        Simulates another writer (a person, CI) moving the branch; no HTTP involved.
        Returns the new commit sha.
        """
        ref = f"refs/heads/{branch or self.default_branch}"
        parent = self._refs[ref]
        flat = self._flatten(self._commits[parent].tree)
        for path, content in changes.items():
            if content is None:
                flat.pop(path, None)
            else:
                flat[path] = ("100644", self._store_blob(_bytes(content)))
        sha = self._store_commit(self._store_flat(flat), (parent,), message, None)
        self._refs[ref] = sha
        return sha

    def fail_next(self, method: str, path_suffix: str, status: int, message: str) -> None:
        """Answer the next ``method`` request whose path ends with ``path_suffix`` with an error.

        Faults queue up and are consumed in order of matching requests.
        """
        self._faults.append(_Fault(method.upper(), path_suffix, status, message))

    def before_next(self, method: str, path_suffix: str, action: Callable[[], object]) -> None:
        """Run ``action`` just before serving the next matching request (once).

        E.g. ``before_next("PATCH", "/git/refs/heads/main", lambda: gh.push({...}))`` makes
        another writer win the race for the branch.
        """
        self._hooks.append((method.upper(), path_suffix, action))

    def writes(self) -> list[RecordedRequest]:
        """Recorded requests that are not ``GET``/``HEAD``."""
        return [r for r in self.requests if r.method not in ("GET", "HEAD")]

    # ----------------------------------------------------------------- object store

    def _store_blob(self, data: bytes) -> str:
        sha = _git_sha("blob", data)
        self._blobs[sha] = data
        return sha

    def _store_tree(self, entries: list[_TreeEntry]) -> str:
        def order(entry: _TreeEntry) -> bytes:
            return entry.name.encode() + (b"/" if entry.type == "tree" else b"")

        ordered = tuple(sorted(entries, key=order))
        data = b"".join(f"{e.mode} {e.name}\0".encode() + bytes.fromhex(e.sha) for e in ordered)
        sha = _git_sha("tree", data)
        self._trees[sha] = ordered
        return sha

    def _store_flat(self, flat: Mapping[str, tuple[str, str]]) -> str:
        """Store nested trees for path → (mode, blob sha); return the root tree sha."""
        here: list[_TreeEntry] = []
        below: dict[str, dict[str, tuple[str, str]]] = {}
        for path, (mode, sha) in flat.items():
            head, sep, rest = path.partition("/")
            if sep:
                below.setdefault(head, {})[rest] = (mode, sha)
            else:
                here.append(_TreeEntry(path, mode, "blob", sha))
        for name, sub in below.items():
            here.append(_TreeEntry(name, "40000", "tree", self._store_flat(sub)))
        return self._store_tree(here)

    def _flatten(self, tree: str, prefix: str = "") -> dict[str, tuple[str, str]]:
        flat: dict[str, tuple[str, str]] = {}
        for entry in self._trees[tree]:
            path = prefix + entry.name
            if entry.type == "tree":
                flat.update(self._flatten(entry.sha, path + "/"))
            else:
                flat[path] = (entry.mode, entry.sha)
        return flat

    def _store_commit(
        self,
        tree: str,
        parents: tuple[str, ...],
        message: str,
        author: Mapping[str, str] | None,
    ) -> str:
        self._clock += 1
        when = _EPOCH + dt.timedelta(seconds=self._clock)
        person = {
            "name": "Fake GitHub User",
            "email": "fake@example.invalid",
            "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        who = {**person, **(author or {})}
        stamp = f"{int(when.timestamp())} +0000"
        lines = [f"tree {tree}", *(f"parent {p}" for p in parents)]
        lines += [f"author {who['name']} <{who['email']}> {stamp}"]
        lines += [f"committer {person['name']} <{person['email']}> {stamp}", "", message]
        sha = _git_sha("commit", "\n".join(lines).encode())
        self._commits[sha] = _Commit(tree, parents, message, who, person)
        return sha

    def _is_ancestor(self, ancestor: str, sha: str) -> bool:
        seen: set[str] = set()
        todo = [sha]
        while todo:
            current = todo.pop()
            if current == ancestor:
                return True
            if current not in seen:
                seen.add(current)
                todo.extend(self._commits[current].parents)
        return False

    # ----------------------------------------------------------------- JSON shapes

    def _api(self, path: str) -> str:
        return f"{self.url}/repos/{self.owner}/{self.repo}{path}"

    def _ref_json(self, ref: str) -> dict[str, Any]:
        sha = self._refs[ref]
        return {
            "ref": ref,
            "node_id": "REF_" + hashlib.sha1(ref.encode()).hexdigest()[:12],
            "url": self._api(f"/git/{ref}"),
            "object": {"sha": sha, "type": "commit", "url": self._api(f"/git/commits/{sha}")},
        }

    def _commit_json(self, sha: str) -> dict[str, Any]:
        commit = self._commits[sha]
        return {
            "sha": sha,
            "node_id": "C_" + sha[:12],
            "url": self._api(f"/git/commits/{sha}"),
            "html_url": f"{self.url}/{self.owner}/{self.repo}/commit/{sha}",
            "author": commit.author,
            "committer": commit.committer,
            "message": commit.message,
            "tree": {"sha": commit.tree, "url": self._api(f"/git/trees/{commit.tree}")},
            "parents": [
                {
                    "sha": p,
                    "url": self._api(f"/git/commits/{p}"),
                    "html_url": f"{self.url}/{self.owner}/{self.repo}/commit/{p}",
                }
                for p in commit.parents
            ],
            "verification": {
                "verified": False,
                "reason": "unsigned",
                "signature": None,
                "payload": None,
            },
        }

    def _tree_json(self, sha: str, recursive: bool) -> dict[str, Any]:
        items: list[dict[str, Any]] = []

        def walk(tree: str, prefix: str) -> None:
            for entry in self._trees[tree]:
                item: dict[str, Any] = {
                    "path": prefix + entry.name,
                    "mode": entry.mode.rjust(6, "0"),
                    "type": entry.type,
                    "sha": entry.sha,
                    "url": self._api(f"/git/{entry.type}s/{entry.sha}"),
                }
                if entry.type == "blob":
                    item["size"] = len(self._blobs[entry.sha])
                items.append(item)
                if recursive and entry.type == "tree":
                    walk(entry.sha, prefix + entry.name + "/")

        walk(sha, "")
        return {
            "sha": sha,
            "url": self._api(f"/git/trees/{sha}"),
            "tree": items,
            "truncated": False,
        }

    # ----------------------------------------------------------------- HTTP plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        body: Any = None
        status = 500
        try:
            if request.body_exists:
                try:
                    body = await request.json()
                except ValueError as err:
                    raise _APIError(400, "Problems parsing JSON") from err
            auth = request.headers.get("Authorization")
            if auth not in (f"token {self.token}", f"Bearer {self.token}"):
                raise _APIError(401, "Bad credentials")
            match = request.match_info
            if match.http_exception is not None:
                self.unhandled.append(f"{request.method} {request.path}")
                raise _APIError(404, "Not Found")
            if (match.get("owner"), match.get("repo")) != (self.owner, self.repo):
                raise _APIError(404, "Not Found")
            for hook in self._hooks:
                if hook[0] == request.method and request.path.endswith(hook[1]):
                    self._hooks.remove(hook)
                    hook[2]()
                    break
            for fault in self._faults:
                if fault.method == request.method and request.path.endswith(fault.path_suffix):
                    self._faults.remove(fault)
                    raise _APIError(fault.status, fault.message)
            response = await handler(request)
            status = response.status
            return response
        except _APIError as err:
            status = err.status
            return web.json_response(
                {"message": err.message, "documentation_url": DOCS}, status=err.status
            )
        finally:
            self.requests.append(
                RecordedRequest(
                    request.method,
                    request.path,
                    dict(request.query),
                    body,
                    request.headers.get("Authorization"),
                    status,
                )
            )

    async def _get_repo(self, request: web.Request) -> web.Response:
        owner = {
            "login": self.owner,
            "id": 1,
            "type": "User",
            "url": f"{self.url}/users/{self.owner}",
        }
        return web.json_response(
            {
                "id": 1,
                "node_id": "R_1",
                "name": self.repo,
                "full_name": self.full_name,
                "private": False,
                "owner": owner,
                "url": self._api(""),
                "html_url": f"{self.url}/{self.full_name}",
                "default_branch": self.default_branch,
            }
        )

    async def _get_ref(self, request: web.Request) -> web.Response:
        ref = "refs/" + request.match_info["ref"]
        if ref not in self._refs:
            raise _APIError(404, "Not Found")
        return web.json_response(self._ref_json(ref))

    async def _create_ref(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("ref"), str):
            raise _APIError(422, "Invalid request.")
        ref, sha = body["ref"], body.get("sha")
        if not ref.startswith("refs/") or ref.count("/") < 2:
            raise _APIError(422, "Reference name must start with 'refs/' and have two slashes.")
        if sha not in self._commits:
            raise _APIError(422, "Object does not exist")
        if ref in self._refs:
            raise _APIError(422, "Reference already exists")
        self._refs[ref] = sha
        return web.json_response(self._ref_json(ref), status=201)

    async def _update_ref(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        ref = "refs/" + request.match_info["ref"]
        if ref not in self._refs:
            raise _APIError(422, "Reference does not exist")
        if not isinstance(body, dict) or not isinstance(body.get("sha"), str):
            raise _APIError(422, "Invalid request.")
        sha = body["sha"]
        if sha not in self._commits:
            raise _APIError(422, "Object does not exist")
        if not body.get("force", False) and not self._is_ancestor(self._refs[ref], sha):
            raise _APIError(422, "Update is not a fast forward")
        self._refs[ref] = sha
        return web.json_response(self._ref_json(ref))

    async def _get_commit(self, request: web.Request) -> web.Response:
        sha = request.match_info["sha"]
        if sha not in self._commits:
            raise _APIError(404, "Not Found")
        return web.json_response(self._commit_json(sha))

    async def _create_commit(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("message"), str):
            raise _APIError(422, 'Invalid request.\n\n"message" wasn\'t supplied.')
        tree, parents = body.get("tree"), body.get("parents", [])
        if tree not in self._trees:
            raise _APIError(422, "Tree SHA does not exist")
        if not isinstance(parents, list) or any(p not in self._commits for p in parents):
            raise _APIError(422, "Parent SHA does not exist or is not a commit object")
        author = body.get("author") if isinstance(body.get("author"), dict) else None
        sha = self._store_commit(tree, tuple(parents), body["message"], author)
        return web.json_response(self._commit_json(sha), status=201)

    async def _get_tree(self, request: web.Request) -> web.Response:
        sha = request.match_info["sha"]
        if sha not in self._trees:
            raise _APIError(404, "Not Found")
        return web.json_response(self._tree_json(sha, "recursive" in request.query))

    async def _create_tree(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("tree"), list):
            raise _APIError(422, "Invalid tree info")
        base = body.get("base_tree")
        if base is not None and base not in self._trees:
            raise _APIError(422, "base_tree is not a valid tree oid")
        flat = self._flatten(base) if base is not None else {}
        for item in body["tree"]:
            self._apply_tree_item(flat, item)
        return web.json_response(self._tree_json(self._store_flat(flat), False), status=201)

    def _apply_tree_item(self, flat: dict[str, tuple[str, str]], item: Any) -> None:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise _APIError(422, "Invalid tree info")
        path, mode, kind = item["path"], item.get("mode"), item.get("type")
        parts = path.split("/")
        if any(p in ("", ".", "..", ".git") for p in parts):
            raise _APIError(422, f"Invalid tree info: path {path!r}")
        if ("sha" in item and "content" in item) or ("sha" not in item and "content" not in item):
            raise _APIError(
                422,
                "Must supply either tree.sha or tree.content. "
                "Request will be rejected if both are present.",
            )
        if kind != "blob" or mode not in _FILE_MODES:
            raise _APIError(422, "FakeGitHub supports only blob entries with a file mode")
        if "content" in item:
            if not isinstance(item["content"], str):
                raise _APIError(422, "Invalid tree info")
            flat[path] = (mode, self._store_blob(item["content"].encode("utf-8")))
        elif item["sha"] is None:
            if path not in flat:
                raise _APIError(422, "GitRPC::BadObjectState")
            del flat[path]
        elif item["sha"] in self._blobs:
            flat[path] = (mode, item["sha"])
        else:
            raise _APIError(422, "Invalid tree info")
        if any("/".join(parts[:i]) in flat for i in range(1, len(parts))):
            raise _APIError(422, "GitRPC::BadObjectState")

    async def _get_blob(self, request: web.Request) -> web.Response:
        sha = request.match_info["sha"]
        if sha not in self._blobs:
            raise _APIError(404, "Not Found")
        data = self._blobs[sha]
        encoded = base64.b64encode(data).decode()
        content = "\n".join(encoded[i : i + 60] for i in range(0, len(encoded), 60)) + "\n"
        return web.json_response(
            {
                "sha": sha,
                "node_id": "B_" + sha[:12],
                "size": len(data),
                "url": self._api(f"/git/blobs/{sha}"),
                "content": content,
                "encoding": "base64",
            }
        )

    async def _create_blob(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            raise _APIError(422, "Invalid request.")
        if body.get("encoding", "utf-8") == "base64":
            data = base64.b64decode(body["content"])
        else:
            data = body["content"].encode("utf-8")
        sha = self._store_blob(data)
        return web.json_response({"sha": sha, "url": self._api(f"/git/blobs/{sha}")}, status=201)


async def _json_body(request: web.Request) -> Any:
    """The request's JSON body (aiohttp caches the bytes, so the middleware's read is reused)."""
    return await request.json() if request.body_exists else None


def _bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content
