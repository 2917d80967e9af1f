"""Where posts go: a git branch, changed by exactly one commit per changeset.

Two implementations of :class:`Publisher`:

* :class:`LocalGitPublisher`, a repository on disk written with dulwich;
* :class:`GitHubPublisher`, a GitHub repository written through the Git Data API
  with PyGithub, as in docs/design/incident.md#one-commit-per-action (ref → commit → tree → commit → ref).

Both build the new tree from the branch head plus the changeset and move the
branch with a compare-and-swap, so a commit never silently drops a concurrent
one: calls in one process are serialised by an ``asyncio.Lock``; a writer in
another process makes the swap fail, and the work is redone on the new head.
Blocking library calls run in ``asyncio.to_thread``.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import os
import posixpath
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from dulwich.errors import (
    ChecksumMismatch,
    FileFormatException,
    NotGitRepository,
    ObjectMissing,
    RefFormatError,
    WrongObjectException,
)
from dulwich.file import FileLocked
from dulwich.object_store import commit_tree_changes
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo
from github import Auth, Github, GithubException, InputGitTreeElement
from github.GitCommit import GitCommit
from github.Repository import Repository

from .content import Changeset

Build = Callable[[Mapping[str, str]], Changeset]
"""Turns the branch's files (path → text, see :meth:`Publisher.snapshot`) into a changeset."""

DEFAULT_AUTHOR = "telegram-idem blog bot <blog-bot@localhost>"
TEXT_SUFFIX = ".md"


class PublishError(Exception):
    """The repository could not be read or written; ``__cause__`` holds the library error."""


class PublishConflict(PublishError):
    """The branch moved under every attempt; nothing was committed."""


class _Moved(Exception):
    """The branch is no longer at the head a commit was built on."""


class Publisher(Protocol):
    """A branch of the blog repository."""

    async def snapshot(self) -> dict[str, str]:
        """Every file on the branch head: path → text.

        Markdown files (``*.md``) carry their UTF-8 text; every other file (images,
        config) maps to ``""``: listed so existence checks work, content not read.

        Raises:
            PublishError: when the repository cannot be read.
        """
        ...

    async def apply(self, changeset: Changeset) -> str:
        """Commit all of ``changeset`` (updates and deletes) as ONE commit on the branch.

        Built on the current head, so a file the changeset does not name keeps
        any concurrent change; a file it names is overwritten (last writer wins).
        Use :meth:`transact` when the new text depends on the old.

        Returns:
            The new commit's sha (40 hex digits); the unchanged head's sha when the
            changeset is empty or changes nothing (no empty commit is made).

        Raises:
            ValueError: when a path is absolute, contains ``..`` or ``.git``.
            PublishConflict: when the branch kept moving under every attempt.
            PublishError: when the repository cannot be written.
        """
        ...

    async def transact(self, build: Build) -> str:
        """Read-modify-write: ``build(snapshot of head)`` committed on that same head.

        If the branch moved before the commit lands, ``build`` runs again on the
        new head, so a concurrent change is never lost. ``build`` must be
        synchronous and free of side effects (it may run several times).

        Returns and raises as :meth:`apply`, plus whatever ``build`` raises.
        """
        ...

    async def commits(self) -> int:
        """Number of commits on the branch (first-parent chain), for tests and demos."""
        ...


def _check_paths(changeset: Changeset) -> None:
    for path in changeset.paths:
        parts = path.split("/")
        if (
            not path
            or path.startswith("/")
            or "\\" in path
            or any(part in ("", ".", "..", ".git") for part in parts)
            or posixpath.normpath(path) != path
        ):
            raise ValueError(f"unsafe repository path: {path!r}")


class _BranchPublisher(abc.ABC):
    """The retry/serialisation logic shared by both publishers.

    Subclasses implement four blocking primitives, run in threads.
    """

    def __init__(self, *, attempts: int, retry_delay: float) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self._attempts = attempts
        self._retry_delay = retry_delay
        self._lock = asyncio.Lock()

    @abc.abstractmethod
    def _head(self) -> str:
        """Sha of the branch head (blocking)."""

    @abc.abstractmethod
    def _files(self, head: str) -> dict[str, str]:
        """Files of commit ``head``, as :meth:`Publisher.snapshot` (blocking)."""

    @abc.abstractmethod
    def _write(self, head: str, changeset: Changeset) -> str:
        """One commit with parent ``head``; CAS the branch from ``head`` (blocking).

        Returns ``head`` when the tree would not change. Raises :class:`_Moved`.
        """

    @abc.abstractmethod
    def _count(self) -> int:
        """Length of the first-parent chain of the branch (blocking)."""

    async def snapshot(self) -> dict[str, str]:
        """See :meth:`Publisher.snapshot`."""
        head = await asyncio.to_thread(self._head)
        return await asyncio.to_thread(self._files, head)

    async def apply(self, changeset: Changeset) -> str:
        """See :meth:`Publisher.apply`."""
        return await self._commit(lambda _files: changeset, read=False)

    async def transact(self, build: Build) -> str:
        """See :meth:`Publisher.transact`."""
        return await self._commit(build, read=True)

    async def commits(self) -> int:
        """See :meth:`Publisher.commits`."""
        return await asyncio.to_thread(self._count)

    async def _commit(self, build: Build, *, read: bool) -> str:
        async with self._lock:
            for attempt in range(self._attempts):
                head = await asyncio.to_thread(self._head)
                files = await asyncio.to_thread(self._files, head) if read else {}
                changeset = build(files)
                _check_paths(changeset)
                if changeset.is_empty:
                    return head
                try:
                    return await asyncio.to_thread(self._write, head, changeset)
                except _Moved:
                    await asyncio.sleep(self._retry_delay * (attempt + 1))
        raise PublishConflict(f"branch kept moving; gave up after {self._attempts} attempts")


# --------------------------------------------------------------------- local git


@contextmanager
def _dulwich_errors() -> Iterator[None]:
    try:
        yield
    except (
        ChecksumMismatch,
        FileFormatException,
        NotGitRepository,
        ObjectMissing,
        RefFormatError,
        WrongObjectException,
        OSError,
        KeyError,
    ) as exc:
        raise PublishError(f"local git repository: {exc!r}") from exc


class LocalGitPublisher(_BranchPublisher):
    """A branch of a git repository on disk, written with dulwich.

    If ``path`` does not exist (or is an empty directory) a **bare** repository is
    created there, with an empty initial commit on ``branch``. Commits only add
    objects and move ``refs/heads/<branch>``; no work tree or index is touched, so
    look at the result with ``git clone <path>`` or ``git --git-dir <path> log``.
    An existing non-bare repository works too, but a checked-out ``branch`` then
    shows the new commits as reverse changes in ``git status``.

    Args:
        path: repository directory.
        branch: branch name, e.g. ``"main"``.
        author: ``"Name <email>"`` used as author and committer.
        attempts: tries per commit when another process moves the branch.
        retry_delay: seconds; attempt ``n`` waits ``n * retry_delay`` after failing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        branch: str = "main",
        *,
        author: str = DEFAULT_AUTHOR,
        attempts: int = 5,
        retry_delay: float = 0.05,
    ) -> None:
        super().__init__(attempts=attempts, retry_delay=retry_delay)
        self.path = Path(path)
        self.branch = branch
        self._ref = Ref(f"refs/heads/{branch}".encode())
        self._author = author.encode()
        self._init_lock = threading.Lock()

    @contextmanager
    def _repo(self) -> Iterator[Repo]:
        with _dulwich_errors():
            with self._init_lock:  # first calls may run in several threads at once
                if not self.path.exists() or not any(self.path.iterdir()):
                    self.path.mkdir(parents=True, exist_ok=True)
                    Repo.init_bare(self.path, default_branch=self.branch.encode()).close()
                repo = Repo(str(self.path))
                try:
                    if self._ref not in repo.refs:
                        self._initial_commit(repo)
                except BaseException:
                    repo.close()
                    raise
            try:
                yield repo
            finally:
                repo.close()

    def _initial_commit(self, repo: Repo) -> None:
        tree = Tree()
        repo.object_store.add_object(tree)
        commit = self._new_commit(tree.id, [], "Initial commit\n")
        repo.object_store.add_object(commit)
        repo.refs.add_if_new(self._ref, commit.id)

    def _new_commit(self, tree: ObjectID, parents: list[ObjectID], message: str) -> Commit:
        commit = Commit()
        commit.tree = tree
        commit.parents = parents
        commit.author = commit.committer = self._author
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.encoding = b"UTF-8"
        commit.message = message.encode()
        return commit

    def _head(self) -> str:
        with self._repo() as repo:
            return repo.refs[self._ref].decode()

    def _files(self, head: str) -> dict[str, str]:
        with self._repo() as repo:
            commit = repo[head.encode()]
            assert isinstance(commit, Commit)
            files: dict[str, str] = {}
            for entry in repo.object_store.iter_tree_contents(commit.tree):
                if not (stat.S_ISREG(entry.mode) or stat.S_ISLNK(entry.mode)):
                    continue
                path = entry.path.decode("utf-8", "surrogateescape")
                text = ""
                if path.endswith(TEXT_SUFFIX):
                    blob = repo[entry.sha]
                    assert isinstance(blob, Blob)
                    text = blob.data.decode("utf-8", "replace")
                files[path] = text
            return files

    def _write(self, head: str, changeset: Changeset) -> str:
        with self._repo() as repo:
            base = repo[head.encode()]
            assert isinstance(base, Commit)
            present = {
                entry.path.decode("utf-8", "surrogateescape")
                for entry in repo.object_store.iter_tree_contents(base.tree)
            }
            changes: list[tuple[bytes, int | None, ObjectID | None]] = []
            for path, text in changeset.updates.items():
                blob = Blob.from_string(text.encode("utf-8"))
                repo.object_store.add_object(blob)
                changes.append((path.encode(), stat.S_IFREG | 0o644, blob.id))
            changes += [
                (path.encode(), None, None) for path in changeset.deletes if path in present
            ]
            tree = commit_tree_changes(repo.object_store, base.tree, changes)
            if tree == base.tree:
                return head
            commit = self._new_commit(tree, [base.id], changeset.message or "Update\n")
            repo.object_store.add_object(commit)
            try:
                swapped = repo.refs.set_if_equals(self._ref, base.id, commit.id)
            except FileLocked:
                swapped = False
            if not swapped:
                raise _Moved
            return commit.id.decode()

    def _count(self) -> int:
        with self._repo() as repo:
            count = 0
            sha: ObjectID | None = repo.refs[self._ref]
            while sha is not None:
                commit = repo[sha]
                assert isinstance(commit, Commit)
                count += 1
                sha = commit.parents[0] if commit.parents else None
            return count


# ------------------------------------------------------------------------ GitHub


@contextmanager
def _github_errors() -> Iterator[None]:
    try:
        yield
    except GithubException as exc:
        raise PublishError(f"GitHub API {exc.status}: {exc.data!r}") from exc
    except OSError as exc:  # requests' errors derive from OSError
        raise PublishError(f"GitHub API unreachable: {exc!r}") from exc


class GitHubPublisher(_BranchPublisher):
    """A branch of a GitHub repository, written through the Git Data API.

    One :meth:`apply` makes these calls (docs/design/incident.md#one-commit-per-action): ``GET git/ref``,
    ``GET git/commits/{head}``, ``GET git/trees/{tree}?recursive=1`` (only when
    the changeset deletes, to skip absent paths, which GitHub rejects),
    ``POST git/trees`` with ``base_tree`` (deletes are entries with ``sha: null``),
    ``POST git/commits``, ``PATCH git/refs/heads/<branch>`` without ``force``, so
    GitHub refuses the move if another commit landed meanwhile (then retried).
    :meth:`snapshot` lists the tree recursively and reads each ``.md`` blob once
    per blob sha (cached). Nothing is requested before the first call.

    Args:
        token: a token allowed to write contents, sent as ``Authorization: token …``.
        repo_full_name: ``"owner/name"``.
        branch: branch name.
        base_url: API root; ``https://<host>/api/v3`` for GitHub Enterprise, a
            local server in tests.
        seconds_between_requests: PyGithub's throttle (seconds, ``None`` = off).
        seconds_between_writes: PyGithub's throttle for POST/PATCH (seconds).
        timeout: per-request timeout in seconds.
        attempts: tries per commit when the branch moves.
        retry_delay: seconds; attempt ``n`` waits ``n * retry_delay`` after failing.
    """

    def __init__(
        self,
        token: str,
        repo_full_name: str,
        branch: str = "main",
        base_url: str = "https://api.github.com",
        *,
        seconds_between_requests: float | None = 0.25,
        seconds_between_writes: float | None = 1.0,
        timeout: float = 15.0,
        attempts: int = 5,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__(attempts=attempts, retry_delay=retry_delay)
        self.repo_full_name = repo_full_name
        self.branch = branch
        self.base_url = base_url.rstrip("/")
        self._github = Github(
            auth=Auth.Token(token),
            base_url=self.base_url,
            timeout=int(timeout),
            seconds_between_requests=seconds_between_requests,
            seconds_between_writes=seconds_between_writes,
        )
        self._repository: Repository | None = None
        self._blobs: dict[str, str] = {}
        self._tree_paths: dict[str, frozenset[str]] = {}

    def _repo(self) -> Repository:
        if self._repository is None:
            self._repository = self._github.get_repo(self.repo_full_name)
        return self._repository

    def _tree(self, tree_sha: str) -> list[tuple[str, str, str]]:
        """``(path, type, sha)`` of every entry under ``tree_sha``, recursively."""
        tree = self._repo().get_git_tree(tree_sha, recursive=True)
        if tree.truncated:
            raise PublishError(f"tree {tree_sha} too large for one recursive listing")
        return [(item.path, item.type, item.sha) for item in tree.tree]

    def _head(self) -> str:
        with _github_errors():
            return self._repo().get_git_ref(f"heads/{self.branch}").object.sha

    def _files(self, head: str) -> dict[str, str]:
        with _github_errors():
            repo = self._repo()
            files: dict[str, str] = {}
            for path, kind, sha in self._tree(repo.get_git_commit(head).tree.sha):
                if kind != "blob":
                    continue
                if path.endswith(TEXT_SUFFIX) and sha not in self._blobs:
                    blob = repo.get_git_blob(sha)
                    data = _decode_blob(blob.content, blob.encoding)
                    self._blobs[sha] = data.decode("utf-8", "replace")
                files[path] = self._blobs[sha] if path.endswith(TEXT_SUFFIX) else ""
            return files

    def _write(self, head: str, changeset: Changeset) -> str:
        with _github_errors():
            repo = self._repo()
            ref = repo.get_git_ref(f"heads/{self.branch}")
            if ref.object.sha != head:
                raise _Moved
            base_commit: GitCommit = repo.get_git_commit(head)
            elements = [
                InputGitTreeElement(path=path, mode="100644", type="blob", content=text)
                for path, text in changeset.updates.items()
            ]
            if changeset.deletes:
                tree_sha = base_commit.tree.sha
                if tree_sha not in self._tree_paths:
                    blobs = (path for path, kind, _ in self._tree(tree_sha) if kind == "blob")
                    self._tree_paths = {tree_sha: frozenset(blobs)}
                present = self._tree_paths[tree_sha]
                elements += [
                    InputGitTreeElement(path=path, mode="100644", type="blob", sha=None)
                    for path in changeset.deletes
                    if path in present
                ]
            if not elements:
                return head
            new_tree = repo.create_git_tree(elements, base_tree=base_commit.tree)
            if new_tree.sha == base_commit.tree.sha:
                return head
            message = changeset.message or "Update\n"
            new_commit = repo.create_git_commit(message, new_tree, [base_commit])
            try:
                ref.edit(new_commit.sha)
            except GithubException as exc:
                if exc.status == 409 or (exc.status == 422 and "fast forward" in str(exc.data)):
                    raise _Moved from exc
                raise
            return new_commit.sha

    def _count(self) -> int:
        with _github_errors():
            repo = self._repo()
            count = 0
            sha: str | None = self._head()
            while sha is not None:
                commit = repo.get_git_commit(sha)
                count += 1
                sha = commit.parents[0].sha if commit.parents else None
            return count


def _decode_blob(content: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(content)
    return content.encode("utf-8")


# ------------------------------------------------------------------- from env


def publisher_from_env(env: Mapping[str, str]) -> Publisher:
    """The publisher the bot uses, configured from environment variables.

    Args:
        env: e.g. ``os.environ``. With both ``GITHUB_TOKEN`` and ``GITHUB_REPO``
            (``owner/name``): a :class:`GitHubPublisher`, at ``GITHUB_API_URL`` if
            set. Otherwise a :class:`LocalGitPublisher` at ``BLOG_REPO_PATH``
            (default ``./blog-repo``). ``BLOG_BRANCH`` (default ``main``) names the
            branch for both. No request or file access happens here.
    """
    branch = env.get("BLOG_BRANCH") or "main"
    token, repo = env.get("GITHUB_TOKEN"), env.get("GITHUB_REPO")
    if token and repo:
        base_url = env.get("GITHUB_API_URL") or "https://api.github.com"
        return GitHubPublisher(token, repo, branch=branch, base_url=base_url)
    return LocalGitPublisher(env.get("BLOG_REPO_PATH") or "./blog-repo", branch=branch)
