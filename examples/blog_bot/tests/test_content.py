"""The blog's content model: slugs, index tables, images and the changesets of each action."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.blog_bot.content import (
    LANGS,
    SLUG_MAX_CHARS,
    Changeset,
    Post,
    add_index_row,
    dead_links,
    delete_changes,
    draft_path,
    index_path,
    list_posts,
    make_post,
    new_index,
    orphan_images,
    parse_front_matter,
    post_path,
    publish_changes,
    referenced_images,
    remove_index_row,
    render_post_file,
    slugify,
    unpublish_changes,
)

DAY = dt.date(2026, 10, 21)
SLUG_CHARS = re.compile(
    r"^[a-z0-9\-\uac00-\ud7a3\u1100-\u11ff\u3131-\u318e\u3041-\u309e\u30a1-\u30fe\u3400-\u4dbf\u4e00-\u9fff\u3005]+$"
)


def post(slug: str = "webhook", title: str = "웹훅 노트", date: dt.date = DAY) -> Post:
    return Post(
        slug=slug, titles={"ko": title, "en": f"{title} (en)", "ja": f"{title} (ja)"}, date=date
    )


def bodies(extra: str = "") -> dict[str, str]:
    return {
        lang: f'---\ntitle: "t-{lang}"\n---\n\n# t-{lang}\n\nbody {lang}\n{extra}' for lang in LANGS
    }


def published(*posts: Post, extra: str = "") -> dict[str, str]:
    files: dict[str, str] = {"README.md": "site\n"}
    for p in posts:
        files = publish_changes(files, p, bodies(extra)).applied_to(files)
    return files


# ------------------------------------------------------------------------ slugs


@pytest.mark.parametrize(
    ("title", "slug"),
    [
        ("Hello, World!", "hello-world"),
        ("웹훅 재시도: Lambda & DynamoDB", "웹훅-재시도-lambda-dynamodb"),
        ("Webhook ノート #1", "webhook-ノート-1"),
        ("冪等性の実装", "冪等性の実装"),
        ("Café  Déjà—vu", "cafe-deja-vu"),
        ("ＡＢＣ　１２３", "abc-123"),
        ("  --a--b--  ", "a-b"),
    ],
)
def test_slugify_examples(title: str, slug: str) -> None:
    assert slugify(title) == slug


def test_slugify_without_usable_letters_is_stable_and_distinct() -> None:
    assert slugify("!!!").startswith("post-")
    assert slugify("!!!") == slugify("!!!")
    assert slugify("!!!") != slugify("???")


def test_slugify_truncates_without_trailing_hyphen() -> None:
    slug = slugify("가" * 79 + " b")
    assert len(slug) <= SLUG_MAX_CHARS
    assert not slug.endswith("-")
    assert len(slugify("x" * 500)) == SLUG_MAX_CHARS


@given(st.text())
def test_slugify_properties(title: str) -> None:
    slug = slugify(title)
    assert 0 < len(slug) <= SLUG_MAX_CHARS
    assert SLUG_CHARS.match(slug), slug
    assert "--" not in slug and not slug.startswith("-") and not slug.endswith("-")
    assert slugify(slug) == slug


def test_paths() -> None:
    assert post_path("en", "x") == "en/tech/x.md"
    assert index_path("ja") == "ja/tech/index.md"
    assert draft_path("ko", "x") == "drafts/ko/x.md"


# ---------------------------------------------------------------- post files


def test_render_post_file_replaces_front_matter() -> None:
    p = Post("s", {"ko": '따옴표 "와" 콜론: 제목'}, DAY)
    text = render_post_file(p, "ko", '---\ntitle: "old"\nfoo: bar\n---\n\n# Heading\n\nBody\n')
    fields, body = parse_front_matter(text)
    assert fields == {
        "title": '따옴표 "와" 콜론: 제목',
        "date": "2026-10-21",
        "lang": "ko",
        "slug": "s",
    }
    assert body == "# Heading\n\nBody\n"
    assert text.count("---") == 2


def test_parse_front_matter_without_block() -> None:
    assert parse_front_matter("# Just text\n") == ({}, "# Just text\n")
    assert parse_front_matter("---\nunterminated\n") == ({}, "---\nunterminated\n")


def test_make_post_takes_translated_titles_from_front_matter() -> None:
    docs = {
        "ko": '---\ntitle: "무시됨"\n---\n본문',
        "en": '---\ntitle: "Webhook Notes #1"\n---\nBody',
        "ja": "no front matter",
    }
    p = make_post("웹훅 노트 #1", docs, DAY)
    assert p.slug == "웹훅-노트-1"
    assert p.titles == {"ko": "웹훅 노트 #1", "en": "Webhook Notes #1", "ja": "웹훅 노트 #1"}
    assert p.date == DAY


def test_post_title_falls_back_to_korean() -> None:
    p = Post("s", {"ko": "제목"}, DAY)
    assert p.title("en") == "제목"


# ---------------------------------------------------------------- index tables


def test_add_index_row_to_missing_index_creates_table() -> None:
    text = add_index_row(None, post(), "en")
    assert "| Date | Title |" in text
    assert list_posts(text)[0].slug == "webhook"
    assert "[웹훅 노트 (en)](./webhook.md)" in text


def test_add_index_row_is_idempotent_and_newest_first() -> None:
    text = add_index_row(None, post("old", "옛 글", dt.date(2026, 1, 1)), "ko")
    text = add_index_row(text, post("new", "새 글"), "ko")
    again = add_index_row(text, post("new", "새 글"), "ko")
    assert again == text
    assert [e.slug for e in list_posts(text)] == ["new", "old"]


def test_add_index_row_refreshes_existing_row_in_place() -> None:
    text = add_index_row(None, post("a", "A"), "ko")
    text = add_index_row(text, post("b", "B"), "ko")
    text = add_index_row(text, post("a", "A2"), "ko")
    entries = list_posts(text)
    assert [(e.slug, e.title) for e in entries] == [("b", "B"), ("a", "A2")]


def test_add_index_row_to_index_without_table_appends_one() -> None:
    text = add_index_row("# Tech\n\nHand-written intro.\n", post(), "ko")
    assert text.startswith("# Tech\n\nHand-written intro.\n")
    assert [e.slug for e in list_posts(text)] == ["webhook"]


def test_titles_with_table_syntax_roundtrip() -> None:
    title = "a | b [c] \\ d"
    text = add_index_row(None, Post("x", {"ko": title}, DAY), "ko")
    assert len(text.splitlines()[-1].split(" | ")) == 2  # the pipe is escaped
    assert list_posts(text)[0].title == title


def test_remove_index_row_removes_only_that_slug() -> None:
    text = new_index("ko")
    for slug in ("a", "a-b", "b"):
        text = add_index_row(text, post(slug), "ko")
    result = remove_index_row(text, "a")
    assert [e.slug for e in list_posts(result)] == ["b", "a-b"]
    assert remove_index_row(result, "a") == result


@given(st.lists(st.sampled_from(["a", "b", "웹훅", "c-d"]), unique=True), st.text(min_size=1))
def test_add_then_remove_restores_the_index(slugs: list[str], title: str) -> None:
    text = new_index("ja")
    for slug in slugs:
        text = add_index_row(text, post(slug), "ja")
    assert remove_index_row(add_index_row(text, post("new-one", title), "ja"), "new-one") == text


# ---------------------------------------------------------------- links, images


def test_dead_links_reports_missing_targets_only() -> None:
    files = published(post("a"), post("b"))
    assert dead_links(files) == []
    del files["en/tech/b.md"]
    assert dead_links(files) == ["en/tech/index.md -> en/tech/b.md"]


def test_dead_links_resolves_relative_forms_and_skips_external() -> None:
    index = (
        "[x](./x) [y](../y/) [g](https://example.com/z.md) [r](/root.md) [h](#top) [q](x.md#sec)"
    )
    files = {"ko/tech/index.md": index, "ko/tech/x.md": ""}
    assert dead_links(files) == ["ko/tech/index.md -> ko/y/index.md"]


def test_referenced_images() -> None:
    md = '![a](/images/a.png) ![b](/images/b%20c.png "t") <img src="/images/d.gif"> ![e](e.png)'
    assert referenced_images(md) == {
        "public/images/a.png",
        "public/images/b c.png",
        "public/images/d.gif",
    }


def test_orphan_images_excludes_shared_and_absent_images() -> None:
    files = published(
        post("a"), extra="![](/images/own.png) ![](/images/shared.png) ![](/images/gone.png)"
    )
    files["ko/other.md"] = "![](/images/shared.png)"
    files["public/images/own.png"] = ""
    files["public/images/shared.png"] = ""
    assert orphan_images(files, "a") == ["public/images/own.png"]
    assert orphan_images(files, "missing") == []


# ------------------------------------------------------------------ changesets


def test_changeset_rejects_a_path_updated_and_deleted() -> None:
    with pytest.raises(ValueError, match="both"):
        Changeset(updates={"a.md": "x"}, deletes=["a.md"])


def test_publish_changes_touches_three_posts_and_three_indexes() -> None:
    files = {"README.md": "site\n"}
    change = publish_changes(files, post(), bodies())
    assert set(change.updates) == {post_path(lang, "webhook") for lang in LANGS} | {
        index_path(lang) for lang in LANGS
    }
    assert change.deletes == []
    after = change.applied_to(files)
    assert dead_links(after) == []
    assert parse_front_matter(after["en/tech/webhook.md"])[0]["title"] == "웹훅 노트 (en)"
    assert "body ja" in after["ja/tech/webhook.md"]


def test_publishing_the_same_post_again_changes_nothing() -> None:
    files = published(post())
    assert publish_changes(files, post(), bodies()).is_empty


def test_publish_changes_requires_every_language() -> None:
    with pytest.raises(ValueError, match="ja"):
        publish_changes({}, post(), {"ko": "", "en": ""})


def test_delete_changes_leaves_no_dead_link_and_no_orphan() -> None:
    files = published(post("a"), post("b"), extra="![](/images/a.png)")
    files["public/images/a.png"] = ""
    files = publish_changes(files, post("a"), bodies("![](/images/only-a.png)")).applied_to(files)
    files["public/images/only-a.png"] = ""
    change = delete_changes(files, "a")
    assert sorted(change.deletes) == sorted(
        [post_path(lang, "a") for lang in LANGS] + ["public/images/only-a.png"]
    )
    assert set(change.updates) == {index_path(lang) for lang in LANGS}
    after = change.applied_to(files)
    assert dead_links(after) == []
    assert all(e.slug == "b" for lang in LANGS for e in list_posts(after[index_path(lang)]))
    assert "public/images/a.png" in after  # still shown by post b
    assert after["en/tech/b.md"] == files["en/tech/b.md"]


def test_delete_of_unknown_slug_is_empty() -> None:
    assert delete_changes(published(post("a")), "zzz").is_empty


def test_unpublish_moves_files_to_drafts_and_drops_rows() -> None:
    files = published(post("a"), post("b"), extra="![](/images/a.png)")
    files["public/images/a.png"] = ""
    change = unpublish_changes(files, "a")
    after = change.applied_to(files)
    for lang in LANGS:
        assert post_path(lang, "a") not in after
        assert after[draft_path(lang, "a")] == files[post_path(lang, "a")]
        assert [e.slug for e in list_posts(after[index_path(lang)])] == ["b"]
    assert dead_links(after) == []
    assert "public/images/a.png" in after
    assert unpublish_changes(after, "a").is_empty


def test_republishing_a_draft_removes_the_draft_copies() -> None:
    files = published(post("a"))
    files = unpublish_changes(files, "a").applied_to(files)
    change = publish_changes(files, post("a"), bodies())
    assert sorted(change.deletes) == sorted(draft_path(lang, "a") for lang in LANGS)
    after = change.applied_to(files)
    assert not any(path.startswith("drafts/") for path in after)
    assert dead_links(after) == []


def test_delete_removes_drafts_too() -> None:
    files = published(post("a"))
    files = unpublish_changes(files, "a").applied_to(files)
    after = delete_changes(files, "a").applied_to(files)
    assert not any("/a.md" in path for path in after)
