"""LocalGitPublisher on a real dulwich repository: one commit per action, nothing lost."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dulwich.objects import Blob, Commit
from dulwich.refs import Ref
from dulwich.repo import Repo

from examples.blog_bot.content import (
    LANGS,
    Changeset,
    dead_links,
    delete_changes,
    draft_path,
    index_path,
    list_posts,
    make_post,
    post_path,
    publish_changes,
    unpublish_changes,
)
from examples.blog_bot.publisher import (
    GitHubPublisher,
    LocalGitPublisher,
    PublishConflict,
    PublishError,
    publisher_from_env,
)
from examples.blog_bot.writer import OfflineWriter

DAY = dt.date(2026, 10, 21)
MAIN = Ref(b"refs/heads/main")


def changed_paths(repo_path: Path, sha: str) -> set[str]:
    """Paths the commit changed relative to its (single) parent, read with dulwich."""
    with Repo(str(repo_path)) as repo:
        commit = repo[sha.encode()]
        assert isinstance(commit, Commit)
        assert len(commit.parents) == 1
        parent = repo[commit.parents[0]]
        assert isinstance(parent, Commit)
        paths: set[str] = set()
        for change in repo.object_store.tree_changes(parent.tree, commit.tree):
            for side in (change[0][0], change[0][1]):
                if side is not None:
                    paths.add(side.decode())
        return paths


def blob_text(repo_path: Path, path: str) -> bytes:
    with Repo(str(repo_path)) as repo:
        commit = repo[repo.refs[MAIN]]
        assert isinstance(commit, Commit)
        tree = repo[commit.tree]
        for entry in repo.object_store.iter_tree_contents(tree.id):
            if entry.path.decode() == path:
                blob = repo[entry.sha]
                assert isinstance(blob, Blob)
                return blob.data
    raise KeyError(path)


async def write_post(title: str, topic: str = "") -> tuple[str, dict[str, str]]:
    writer = OfflineWriter(delay_scale=0)
    ko = await writer.draft(title, topic)
    en, ja = await asyncio.gather(writer.translate(ko, "en"), writer.translate(ko, "ja"))
    return title, {"ko": ko, "en": en, "ja": ja}


def publish(title: str, docs: Mapping[str, str]) -> Callable[[Mapping[str, str]], Changeset]:
    def build(files: Mapping[str, str]) -> Changeset:
        return publish_changes(files, make_post(title, docs, DAY), docs)

    return build


@pytest.fixture
def repo_path(tmp_path: Path) -> Path:
    return tmp_path / "blog-repo"


@pytest.fixture
def publisher(repo_path: Path) -> LocalGitPublisher:
    return LocalGitPublisher(repo_path, retry_delay=0)


async def test_creates_a_bare_repository_with_one_initial_commit(
    publisher: LocalGitPublisher, repo_path: Path
) -> None:
    assert not await asyncio.to_thread(repo_path.exists)
    assert await publisher.snapshot() == {}
    assert await publisher.commits() == 1
    with Repo(str(repo_path)) as repo:
        assert repo.bare
        assert MAIN in repo.refs


async def test_publish_is_one_commit_with_six_paths(
    publisher: LocalGitPublisher, repo_path: Path
) -> None:
    title, docs = await write_post("웹훅 노트 #1")
    sha = await publisher.transact(publish(title, docs))
    assert await publisher.commits() == 2
    slug = "웹훅-노트-1"
    expected = {post_path(lang, slug) for lang in LANGS} | {index_path(lang) for lang in LANGS}
    assert changed_paths(repo_path, sha) == expected
    files = await publisher.snapshot()
    assert set(files) == expected
    assert dead_links(files) == []
    assert "Webhook Notes #1" in files["en/tech/웹훅-노트-1.md"]
    assert blob_text(repo_path, "ja/tech/index.md").decode() == files["ja/tech/index.md"]


async def test_replayed_publish_makes_no_second_commit(publisher: LocalGitPublisher) -> None:
    title, docs = await write_post("같은 글", "멱등성")
    first = await publisher.transact(publish(title, docs))
    second = await publisher.transact(publish(title, docs))
    assert second == first
    assert (
        await publisher.apply(
            Changeset(
                updates={"ko/tech/index.md": (await publisher.snapshot())["ko/tech/index.md"]}
            )
        )
        == first
    )
    assert await publisher.commits() == 2


async def test_delete_is_one_commit_and_leaves_no_dead_link(
    publisher: LocalGitPublisher, repo_path: Path
) -> None:
    for title in ("첫 글", "둘째 글"):
        await publisher.transact(publish(*(await write_post(title))))
    await publisher.apply(
        Changeset(
            updates={
                "public/images/first.png": "not really a png",
                "ko/tech/첫-글.md": "---\ntitle: 첫 글\n---\n![](/images/first.png)\n",
            }
        )
    )
    before = await publisher.commits()
    sha = await publisher.transact(lambda files: delete_changes(files, "첫-글"))
    assert await publisher.commits() == before + 1
    gone = {post_path(lang, "첫-글") for lang in LANGS} | {"public/images/first.png"}
    assert changed_paths(repo_path, sha) == gone | {index_path(lang) for lang in LANGS}
    files = await publisher.snapshot()
    assert not gone & set(files)
    assert dead_links(files) == []
    assert [e.slug for e in list_posts(files["en/tech/index.md"])] == ["둘째-글"]


async def test_unpublish_is_one_commit_into_drafts(
    publisher: LocalGitPublisher, repo_path: Path
) -> None:
    await publisher.transact(publish(*(await write_post("초안이 될 글"))))
    published = await publisher.snapshot()
    sha = await publisher.transact(lambda files: unpublish_changes(files, "초안이-될-글"))
    assert await publisher.commits() == 3
    files = await publisher.snapshot()
    for lang in LANGS:
        assert post_path(lang, "초안이-될-글") not in files
        assert files[draft_path(lang, "초안이-될-글")] == published[post_path(lang, "초안이-될-글")]
        assert list_posts(files[index_path(lang)]) == []
    assert dead_links(files) == []
    assert len(changed_paths(repo_path, sha)) == 9


async def test_concurrent_applies_keep_both_changes(publisher: LocalGitPublisher) -> None:
    await asyncio.gather(
        publisher.apply(Changeset(updates={"a.md": "A"}, message="a")),
        publisher.apply(Changeset(updates={"b.md": "B"}, message="b")),
    )
    assert await publisher.snapshot() == {"a.md": "A", "b.md": "B"}
    assert await publisher.commits() == 3


async def test_concurrent_publishes_keep_both_index_rows(publisher: LocalGitPublisher) -> None:
    posts = [await write_post(f"동시 글 {n}") for n in range(3)]
    await asyncio.gather(*(publisher.transact(publish(*p)) for p in posts))
    files = await publisher.snapshot()
    for lang in LANGS:
        slugs = {e.slug for e in list_posts(files[index_path(lang)])}
        assert slugs == {"동시-글-0", "동시-글-1", "동시-글-2"}
    assert await publisher.commits() == 4


async def test_another_writer_between_read_and_commit_is_not_lost(
    publisher: LocalGitPublisher, repo_path: Path
) -> None:
    await publisher.snapshot()  # create the repository
    other = LocalGitPublisher(repo_path)  # e.g. another process: no shared lock
    title, docs = await write_post("경합")
    builds = 0

    def build(files: Mapping[str, str]) -> Changeset:
        nonlocal builds
        builds += 1
        if builds == 1:  # the branch moves after our read
            other_post = make_post("다른 글", docs, DAY)
            change = publish_changes(files, other_post, docs)
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, other.apply(change)).result()
        return publish(title, docs)(files)

    await publisher.transact(build)
    assert builds == 2
    files = await publisher.snapshot()
    assert {e.slug for e in list_posts(files["ko/tech/index.md"])} == {"경합", "다른-글"}
    assert await publisher.commits() == 3


async def test_gives_up_when_the_branch_never_settles(
    repo_path: Path, publisher: LocalGitPublisher
) -> None:
    await publisher.snapshot()
    limited = LocalGitPublisher(repo_path, attempts=2, retry_delay=0)
    rival = LocalGitPublisher(repo_path)
    counter = 0

    def build(files: Mapping[str, str]) -> Changeset:
        nonlocal counter
        counter += 1
        with ThreadPoolExecutor(1) as pool:
            change = Changeset(updates={"rival.md": str(counter)})
            pool.submit(asyncio.run, rival.apply(change)).result()
        return Changeset(updates={"mine.md": "x"})

    with pytest.raises(PublishConflict):
        await limited.transact(build)
    assert counter == 2
    assert "mine.md" not in await publisher.snapshot()


async def test_apply_ignores_deletes_of_absent_paths(publisher: LocalGitPublisher) -> None:
    head = await publisher.apply(Changeset(updates={"a.md": "A"}))
    assert await publisher.apply(Changeset(deletes=["nope.md", "dir/nope.md"])) == head
    assert await publisher.commits() == 2


@pytest.mark.parametrize("path", ["/abs.md", "../up.md", "a/../b.md", ".git/config", "a//b.md", ""])
async def test_unsafe_paths_are_rejected(publisher: LocalGitPublisher, path: str) -> None:
    with pytest.raises(ValueError, match="unsafe"):
        await publisher.apply(Changeset(updates={path: "x"}))
    assert await publisher.commits() == 1


async def test_existing_repository_keeps_its_history(tmp_path: Path) -> None:
    path = tmp_path / "work"
    with Repo.init(str(path), mkdir=True) as repo:
        (path / "README.md").write_text("hello\n")
        repo.get_worktree().stage([b"README.md"])
        repo.get_worktree().commit(message=b"first", ref=MAIN)
    publisher = LocalGitPublisher(path)
    assert await publisher.snapshot() == {"README.md": "hello\n"}
    await publisher.apply(Changeset(updates={"ko/tech/index.md": "x"}))
    assert await publisher.snapshot() == {"README.md": "hello\n", "ko/tech/index.md": "x"}
    assert await publisher.commits() == 2


async def test_a_directory_that_is_not_a_repository_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(PublishError):
        await LocalGitPublisher(tmp_path).snapshot()


def test_publisher_from_env_defaults_to_local_git(tmp_path: Path) -> None:
    chosen = publisher_from_env({"BLOG_REPO_PATH": str(tmp_path / "r"), "BLOG_BRANCH": "site"})
    assert isinstance(chosen, LocalGitPublisher)
    assert chosen.path == tmp_path / "r" and chosen.branch == "site"
    assert not (tmp_path / "r").exists()  # nothing touched until used
    default = publisher_from_env({"GITHUB_TOKEN": "t"})  # no GITHUB_REPO: still local
    assert isinstance(default, LocalGitPublisher)
    assert default.path == Path("blog-repo")
    assert not isinstance(default, GitHubPublisher)


async def test_first_calls_in_parallel_create_the_repository_once(
    publisher: LocalGitPublisher,
) -> None:
    results = await asyncio.gather(
        publisher.snapshot(),
        publisher.commits(),
        publisher.apply(Changeset(updates={"a.md": "A"})),
        publisher.snapshot(),
    )
    assert results[1] in (1, 2)
    assert await publisher.snapshot() == {"a.md": "A"}
    assert await publisher.commits() == 2
