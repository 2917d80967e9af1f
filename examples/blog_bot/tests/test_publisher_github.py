"""GitHubPublisher against FakeGitHub (loopback): the docs/design/incident.md Git Data API flow, one commit per action."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from dulwich.index import commit_tree
from dulwich.object_store import MemoryObjectStore
from dulwich.objects import Blob
from github import Auth, Github, GithubException, InputGitTreeElement

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
    PublishConflict,
    PublishError,
    publisher_from_env,
)
from examples.blog_bot.tests.github_api import FakeGitHub
from examples.blog_bot.writer import OfflineWriter

DAY = dt.date(2026, 10, 21)
SEED: dict[str, str | bytes] = {
    "README.md": "# blog\n",
    "public/images/logo.png": b"\x89PNG\r\n\x1a\n\x00binary",
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(files=SEED) as server:
        yield server


def make_publisher(fake: FakeGitHub, **kwargs: Any) -> GitHubPublisher:
    options: dict[str, Any] = {
        "seconds_between_requests": None,
        "seconds_between_writes": None,
        "retry_delay": 0,
    }
    options.update(kwargs)
    return GitHubPublisher(fake.token, fake.full_name, base_url=fake.url, **options)


@pytest.fixture
def publisher(fake: FakeGitHub) -> GitHubPublisher:
    return make_publisher(fake)


async def write_post(title: str) -> dict[str, str]:
    writer = OfflineWriter(delay_scale=0)
    ko = await writer.draft(title, "")
    en, ja = await asyncio.gather(writer.translate(ko, "en"), writer.translate(ko, "ja"))
    return {"ko": ko, "en": en, "ja": ja}


def publish(title: str, docs: Mapping[str, str]) -> Callable[[Mapping[str, str]], Changeset]:
    def build(files: Mapping[str, str]) -> Changeset:
        return publish_changes(files, make_post(title, docs, DAY), docs)

    return build


def requests_to(fake: FakeGitHub, method: str, suffix: str) -> list[Any]:
    return [r for r in fake.requests if r.method == method and r.path.endswith(suffix)]


# ------------------------------------------------------------------- reading


async def test_snapshot_lists_every_file_and_reads_markdown(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    assert await publisher.snapshot() == {"README.md": "# blog\n", "public/images/logo.png": ""}
    blob_gets = [r for r in fake.requests if "/git/blobs/" in r.path]
    assert len(blob_gets) == 1  # only README.md; images are never downloaded
    await publisher.snapshot()
    assert len([r for r in fake.requests if "/git/blobs/" in r.path]) == 1  # cached by sha


async def test_nothing_is_requested_before_use(fake: FakeGitHub) -> None:
    make_publisher(fake)
    assert fake.requests == []


# ------------------------------------------------------------------- writing


async def test_publish_is_one_commit_through_the_git_data_api(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    docs = await write_post("웹훅 노트 #1")
    before = len(fake.log())
    sha = await publisher.transact(publish("웹훅 노트 #1", docs))
    assert fake.head() == sha
    assert len(fake.log()) == before + 1
    slug = "웹훅-노트-1"
    expected = {post_path(lang, slug) for lang in LANGS} | {index_path(lang) for lang in LANGS}
    assert fake.changed_paths(sha) == expected
    assert len(requests_to(fake, "POST", "/git/trees")) == 1
    assert len(requests_to(fake, "POST", "/git/commits")) == 1
    patches = requests_to(fake, "PATCH", "/git/refs/heads/main")
    assert len(patches) == 1 and patches[0].body == {"sha": sha}
    tree_body = requests_to(fake, "POST", "/git/trees")[0].body
    assert tree_body["base_tree"] == fake.tree_sha(fake.log()[1])
    files = fake.text_files()
    assert files["public/images/logo.png"].startswith("\ufffdPNG")  # untouched binary
    assert dead_links(files) == []
    assert "Webhook Notes #1" in files[f"en/tech/{slug}.md"]
    assert fake.commit_message(sha).startswith(f"Publish {slug}")
    assert all(r.authorization == f"token {fake.token}" for r in fake.requests)


async def test_replayed_publish_makes_no_second_commit(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    docs = await write_post("한 번만")
    first = await publisher.transact(publish("한 번만", docs))
    writes = len(fake.writes())
    assert await publisher.transact(publish("한 번만", docs)) == first
    assert len(fake.writes()) == writes  # nothing to change: no tree, commit or ref write
    assert len(fake.log()) == 2


async def test_unchanged_tree_makes_no_empty_commit(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    head = fake.head()
    assert await publisher.apply(Changeset(updates={"README.md": "# blog\n"})) == head
    assert requests_to(fake, "POST", "/git/commits") == []
    assert requests_to(fake, "PATCH", "/git/refs/heads/main") == []


async def test_delete_is_one_commit_with_null_sha_entries(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    for title in ("첫 글", "둘째 글"):
        await publisher.transact(publish(title, await write_post(title)))
    fake.push(
        {
            "public/images/first.png": b"\x89PNG first",
            "ko/tech/첫-글.md": "---\ntitle: 첫 글\n---\n![](/images/first.png)\n",
        }
    )
    before = len(fake.log())
    sha = await publisher.transact(lambda files: delete_changes(files, "첫-글"))
    assert len(fake.log()) == before + 1
    gone = {post_path(lang, "첫-글") for lang in LANGS} | {"public/images/first.png"}
    assert fake.changed_paths(sha) == gone | {index_path(lang) for lang in LANGS}
    elements = requests_to(fake, "POST", "/git/trees")[-1].body["tree"]
    assert {e["path"] for e in elements if "sha" in e and e["sha"] is None} == gone
    files = fake.text_files()
    assert not gone & set(files)
    assert dead_links(files) == []
    assert [e.slug for e in list_posts(files["ja/tech/index.md"])] == ["둘째-글"]


async def test_unpublish_is_one_commit(fake: FakeGitHub, publisher: GitHubPublisher) -> None:
    await publisher.transact(publish("초안", await write_post("초안")))
    sha = await publisher.transact(lambda files: unpublish_changes(files, "초안"))
    assert len(fake.log()) == 3
    files = fake.text_files()
    assert {draft_path(lang, "초안") for lang in LANGS} <= set(files)
    assert not {post_path(lang, "초안") for lang in LANGS} & set(files)
    assert dead_links(files) == []
    assert len(fake.changed_paths(sha)) == 9


async def test_deleting_absent_paths_sends_nothing(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    head = fake.head()
    assert await publisher.apply(Changeset(deletes=["gone.md", "ko/tech/gone.md"])) == head
    assert fake.writes() == []


async def test_concurrent_applies_keep_both_changes(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    await asyncio.gather(
        publisher.apply(Changeset(updates={"a.md": "A"})),
        publisher.apply(Changeset(updates={"b.md": "B"})),
    )
    files = fake.text_files()
    assert files["a.md"] == "A" and files["b.md"] == "B"
    assert len(fake.log()) == 3


async def test_a_push_between_read_and_commit_is_not_lost(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    docs = await write_post("경합")
    builds = 0

    def build(files: Mapping[str, str]) -> Changeset:
        nonlocal builds
        builds += 1
        if builds == 1:
            fake.push(
                {"ko/tech/index.md": files.get("ko/tech/index.md", "") + "\nedited by hand\n"}
            )
        return publish("경합", docs)(files)

    await publisher.transact(build)
    assert builds == 2
    index = fake.text_files()["ko/tech/index.md"]
    assert "edited by hand" in index
    assert [e.slug for e in list_posts(index)] == ["경합"]
    assert len(fake.log()) == 3


async def test_ref_moving_after_the_commit_is_built_is_rejected_and_retried(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    fake.before_next("PATCH", "/git/refs/heads/main", lambda: fake.push({"hand.md": "by hand"}))
    await publisher.apply(Changeset(updates={"bot.md": "by bot"}))
    statuses = [r.status for r in requests_to(fake, "PATCH", "/git/refs/heads/main")]
    assert statuses == [422, 200]
    files = fake.text_files()
    assert files["hand.md"] == "by hand" and files["bot.md"] == "by bot"
    assert len(fake.log()) == 3


async def test_gives_up_when_the_branch_never_settles(fake: FakeGitHub) -> None:
    publisher = make_publisher(fake, attempts=3)
    counter = 0

    def build(files: Mapping[str, str]) -> Changeset:
        nonlocal counter
        counter += 1
        fake.push({"rival.md": str(counter)})
        return Changeset(updates={"mine.md": "x"})

    with pytest.raises(PublishConflict):
        await publisher.transact(build)
    assert counter == 3
    assert "mine.md" not in fake.files()


async def test_api_errors_become_publish_errors(
    fake: FakeGitHub, publisher: GitHubPublisher
) -> None:
    fake.fail_next("POST", "/git/trees", 422, "Invalid tree info")
    with pytest.raises(PublishError) as info:
        await publisher.apply(Changeset(updates={"a.md": "A"}))
    assert isinstance(info.value.__cause__, GithubException)
    assert info.value.__cause__.status == 422
    assert len(fake.log()) == 1
    await publisher.apply(Changeset(updates={"a.md": "A"}))  # the fault was one-shot
    assert fake.text_files()["a.md"] == "A"


async def test_bad_token_is_a_publish_error(fake: FakeGitHub) -> None:
    publisher = GitHubPublisher(
        "wrong", fake.full_name, base_url=fake.url, seconds_between_requests=None
    )
    with pytest.raises(PublishError, match="401"):
        await publisher.snapshot()


async def test_unreachable_api_is_a_publish_error(fake: FakeGitHub) -> None:
    url = fake.url
    await fake.close()
    publisher = GitHubPublisher("t", "o/r", base_url=url, timeout=2, seconds_between_requests=None)
    with pytest.raises(PublishError):
        await publisher.snapshot()


def test_publisher_from_env_picks_github() -> None:
    chosen = publisher_from_env(
        {
            "GITHUB_TOKEN": "t",
            "GITHUB_REPO": "me/blog",
            "GITHUB_API_URL": "http://127.0.0.1:9/api/v3/",
            "BLOG_BRANCH": "pages",
        }
    )
    assert isinstance(chosen, GitHubPublisher)
    assert (chosen.repo_full_name, chosen.branch) == ("me/blog", "pages")
    assert chosen.base_url == "http://127.0.0.1:9/api/v3"
    default = publisher_from_env({"GITHUB_TOKEN": "t", "GITHUB_REPO": "me/blog"})
    assert isinstance(default, GitHubPublisher)
    assert default.base_url == "https://api.github.com"  # constructed only, never called


# ------------------------------------------------------- the fake behaves like GitHub


def _client(fake: FakeGitHub) -> Github:
    return Github(
        auth=Auth.Token(fake.token),
        base_url=fake.url,
        seconds_between_requests=None,
        seconds_between_writes=None,
        retry=None,
    )


async def test_fake_refuses_non_fast_forward_and_bad_tree_entries(fake: FakeGitHub) -> None:
    def scenario() -> list[int]:
        repo = _client(fake).get_repo(fake.full_name)
        base = repo.get_git_commit(fake.head())
        tree = repo.create_git_tree(
            [InputGitTreeElement("x.md", "100644", "blob", content="x")], base_tree=base.tree
        )
        stale = repo.create_git_commit("stale", tree, [base])
        statuses = []
        fake.push({"other.md": "o"})
        for attempt in (
            lambda: repo.get_git_ref("heads/main").edit(stale.sha),
            lambda: repo.create_git_tree(
                [InputGitTreeElement("absent.md", "100644", "blob", sha=None)], base_tree=base.tree
            ),
            lambda: repo.create_git_tree([InputGitTreeElement("y.md", "100644", "blob")]),
        ):
            try:
                attempt()
            except GithubException as exc:
                statuses.append(exc.status)
        repo.get_git_ref("heads/main").edit(stale.sha, force=True)
        return statuses

    assert await asyncio.to_thread(scenario) == [422, 422, 422]
    assert set(fake.files()) == {"README.md", "public/images/logo.png", "x.md"}


async def test_fake_object_ids_are_real_git_ids(fake: FakeGitHub) -> None:
    store = MemoryObjectStore()
    blobs = []
    for path, content in sorted(SEED.items()):
        blob = Blob.from_string(content.encode() if isinstance(content, str) else content)
        store.add_object(blob)
        blobs.append((path.encode(), blob.id, 0o100644))
    expected_tree = commit_tree(store, blobs).decode()
    assert fake.tree_sha() == expected_tree


async def test_fake_answers_unknown_routes_with_404(fake: FakeGitHub) -> None:
    def call() -> int:
        try:
            _client(fake).get_repo(fake.full_name).get_contents("README.md")
        except GithubException as exc:
            return exc.status
        return 200

    assert await asyncio.to_thread(call) == 404
    assert fake.unhandled == ["GET /repos/octo/blog/contents/README.md"]
