"""The blog's content model: slugs, post files, index tables and changesets.

Everything here is pure: functions take the repository's files as a mapping of
path → text (as returned by ``Publisher.snapshot()``) and return new text or a
:class:`Changeset`. Nothing here talks to git, GitHub or Telegram.

Repository layout (a VitePress site)::

    ko/tech/<slug>.md        the Korean original
    en/tech/<slug>.md        English translation
    ja/tech/<slug>.md        Japanese translation
    <lang>/tech/index.md     a table "| Date | Title |" with one row per post
    drafts/<lang>/<slug>.md  unpublished posts (exclude ``drafts/`` with VitePress
                             ``srcExclude`` so they are not built)
    public/images/<name>     images, referenced from posts as ``![](/images/<name>)``

Paths are POSIX, relative to the repository root, without a leading ``/``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import posixpath
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

LANGS: tuple[str, ...] = ("ko", "en", "ja")
"""Languages of every post; ``ko`` is the original, the others translations."""

SLUG_MAX_CHARS = 80
"""Upper bound on ``len(slugify(...))``, in characters (not bytes)."""

INDEX_HEADER = "| Date | Title |"
INDEX_SEPARATOR = "| --- | --- |"

_INDEX_TITLES = {"ko": "기술 블로그", "en": "Tech", "ja": "技術ブログ"}


# ---------------------------------------------------------------- slugs & paths


def _keep_as_is(char: str) -> bool:
    """True for Hangul and Japanese (kana, kanji) letters, which slugs keep."""
    code = ord(char)
    return (
        0xAC00 <= code <= 0xD7A3  # Hangul syllables
        or 0x1100 <= code <= 0x11FF  # Hangul jamo
        or 0x3131 <= code <= 0x318E  # Hangul compatibility jamo
        or 0x3041 <= code <= 0x3096  # Hiragana
        or 0x30A1 <= code <= 0x30FA  # Katakana (without the middle dot ・)
        or code in (0x309D, 0x309E, 0x30FC, 0x30FD, 0x30FE)  # iteration marks, ー
        or 0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or code == 0x3005  # 々
    )


def slugify(title: str) -> str:
    """Turn a title into a stable, URL- and filename-safe slug.

    Args:
        title: any text, e.g. ``"웹훅 재시도: Lambda & DynamoDB"``.

    Returns:
        A non-empty string of at most :data:`SLUG_MAX_CHARS` characters made of
        lowercase ASCII letters and digits, Korean and Japanese letters, and
        single hyphens (never leading or trailing), e.g.
        ``"웹훅-재시도-lambda-dynamodb"``. Accented Latin letters lose their accents;
        every other character becomes a separator. A title with no usable letter
        gets ``"post-<10 hex digits of its SHA-1>"``. The result depends on
        ``title`` only, and ``slugify(slugify(t)) == slugify(t)``.
    """
    text = unicodedata.normalize("NFKC", title)
    out: list[str] = []
    for char in text:
        if char.isascii():
            out.append(char.lower() if char.isalnum() else "-")
        elif _keep_as_is(char):
            out.append(char)
        else:
            ascii_part = "".join(
                c.lower()
                for c in unicodedata.normalize("NFKD", char)
                if c.isascii() and c.isalnum()
            )
            out.append(ascii_part or "-")
    slug = re.sub(r"-{2,}", "-", "".join(out)).strip("-")
    slug = slug[:SLUG_MAX_CHARS].rstrip("-")
    if not slug:
        slug = "post-" + hashlib.sha1(title.encode("utf-8")).hexdigest()[:10]
    return slug


def post_path(lang: str, slug: str) -> str:
    """Path of a published post, e.g. ``post_path("en", "x") == "en/tech/x.md"``."""
    return f"{lang}/tech/{slug}.md"


def index_path(lang: str) -> str:
    """Path of a language's post table, e.g. ``"ko/tech/index.md"``."""
    return f"{lang}/tech/index.md"


def draft_path(lang: str, slug: str) -> str:
    """Path of an unpublished post, e.g. ``"drafts/ja/x.md"``."""
    return f"drafts/{lang}/{slug}.md"


# ------------------------------------------------------------------- the post


@dataclass(frozen=True)
class Post:
    """A post in the three languages.

    Attributes:
        slug: file name stem shared by the three language files.
        titles: title per language code (``"ko"``, ``"en"``, ``"ja"``); a missing
            language falls back to the Korean title, see :meth:`title`.
        date: publication date (the index shows it as ``YYYY-MM-DD``).
    """

    slug: str
    titles: Mapping[str, str]
    date: dt.date

    def title(self, lang: str) -> str:
        """Title in ``lang``, else the Korean one, else the slug."""
        return self.titles.get(lang) or self.titles.get("ko") or self.slug


def parse_front_matter(markdown: str) -> tuple[dict[str, str], str]:
    """Split a leading ``---`` front matter block from a markdown document.

    Only flat ``key: value`` lines are understood (values may be JSON/YAML
    double-quoted strings); this is not a YAML parser.

    Args:
        markdown: the document text.

    Returns:
        ``(fields, body)``: the front matter keys and values (empty when there is
        none) and the text after the closing ``---`` with leading blank lines
        removed (the whole text when there is no front matter).
    """
    lines = markdown.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, markdown
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        return {}, markdown
    fields: dict[str, str] = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = str(json.loads(value))
            except ValueError:
                value = value[1:-1]
        fields[key.strip()] = value
    body = "\n".join(lines[end + 1 :]).lstrip("\n")
    return fields, body + ("\n" if body and markdown.endswith("\n") else "")


def make_post(title: str, bodies: Mapping[str, str], date: dt.date) -> Post:
    """Build the :class:`Post` for a Korean title and the writer's documents.

    Args:
        title: the Korean title; the slug is ``slugify(title)``.
        bodies: markdown per language code; each translation's front matter
            ``title`` becomes that language's title (fallback: ``title``).
        date: publication date.
    """
    titles = {"ko": title}
    for lang, body in bodies.items():
        if lang != "ko":
            titles[lang] = parse_front_matter(body)[0].get("title") or title
    return Post(slug=slugify(title), titles=titles, date=date)


def render_post_file(post: Post, lang: str, body: str) -> str:
    """The file written at ``post_path(lang, post.slug)``.

    Args:
        post: the post.
        lang: language code of ``body``.
        body: markdown from the writer; its own front matter, if any, is replaced.

    Returns:
        Markdown with front matter ``title``, ``date`` (ISO), ``lang`` and ``slug``,
        ending with exactly one newline.
    """
    _, text = parse_front_matter(body)
    head = [
        "---",
        f"title: {json.dumps(post.title(lang), ensure_ascii=False)}",
        f"date: {post.date.isoformat()}",
        f"lang: {lang}",
        f"slug: {post.slug}",
        "---",
        "",
    ]
    return "\n".join(head) + "\n" + text.strip("\n") + "\n"


# ---------------------------------------------------------------- index tables


@dataclass(frozen=True)
class IndexEntry:
    """One row of an index table: ``date`` as written (normally ``YYYY-MM-DD``)."""

    date: str
    title: str
    slug: str


_ROW = re.compile(
    r"^\|\s*(?P<date>[^|]*?)\s*\|\s*\[(?P<title>(?:\\.|[^\\\]])*)\]"
    r"\(\./(?P<target>[^)\s]+)\)\s*\|\s*$"
)


def _escape_title(title: str) -> str:
    flat = " ".join(title.split())
    return re.sub(r"([\\|\[\]])", r"\\\1", flat)


def _unescape_title(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _row_slug(line: str) -> str | None:
    match = _ROW.match(line.strip())
    if match is None or not match["target"].endswith(".md"):
        return None
    return unquote(match["target"][: -len(".md")])


def index_row(post: Post, lang: str) -> str:
    """The table row for ``post``: ``| 2026-10-21 | [title](./slug.md) |``.

    ``|``, ``[``, ``]`` and ``\\`` in the title are backslash-escaped; line breaks
    become spaces.
    """
    title = _escape_title(post.title(lang))
    return f"| {post.date.isoformat()} | [{title}](./{post.slug}.md) |"


def new_index(lang: str) -> str:
    """An index file with a heading and an empty post table."""
    name = _INDEX_TITLES.get(lang, "Tech")
    return f"---\ntitle: {name}\n---\n\n# {name}\n\n{INDEX_HEADER}\n{INDEX_SEPARATOR}\n"


def add_index_row(index_text: str | None, post: Post, lang: str) -> str:
    """Return ``index_text`` with a row for ``post`` (idempotent).

    Args:
        index_text: current index file, or ``None``/``""`` when there is none
            (a fresh one from :func:`new_index` is used).
        post: the post to list.
        lang: language of this index.

    Returns:
        The new text. A row already linking to ``post.slug`` is replaced in place,
        so adding the same slug twice leaves one row; otherwise the row goes at the
        top of the table (newest first). An index without a table gets one
        appended.
    """
    text = index_text or new_index(lang)
    row = index_row(post, lang)
    lines = text.splitlines()
    existing = [i for i, line in enumerate(lines) if _row_slug(line) == post.slug]
    if existing:
        lines[existing[0]] = row
        lines = [line for i, line in enumerate(lines) if i not in existing[1:]]
        return "\n".join(lines) + "\n"
    for i in range(len(lines) - 1):
        if lines[i].strip().startswith("|") and re.fullmatch(
            r"\|(\s*:?-{3,}:?\s*\|)+", lines[i + 1].strip()
        ):
            lines.insert(i + 2, row)
            return "\n".join(lines) + "\n"
    return text.rstrip("\n") + f"\n\n{INDEX_HEADER}\n{INDEX_SEPARATOR}\n{row}\n"


def remove_index_row(index_text: str, slug: str) -> str:
    """Return ``index_text`` without any table row linking to ``./<slug>.md``.

    Every other line is kept byte for byte (the result ends with a newline).
    """
    lines = [line for line in index_text.splitlines() if _row_slug(line) != slug]
    return "\n".join(lines) + "\n"


def list_posts(index_text: str) -> list[IndexEntry]:
    """The rows of an index table in file order (newest first when built here)."""
    entries: list[IndexEntry] = []
    for line in index_text.splitlines():
        match = _ROW.match(line.strip())
        slug = _row_slug(line)
        if match is not None and slug is not None:
            entries.append(IndexEntry(match["date"], _unescape_title(match["title"]), slug))
    return entries


# ------------------------------------------------------------- links & images

_LINK = re.compile(r"(?<!!)\[(?:\\.|[^\\\]])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE_MD = re.compile(r"!\[[^\]]*\]\(\s*<?(/images/[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE_HTML = re.compile(r"<img\b[^>]*\bsrc=[\"'](/images/[^\"']+)[\"']", re.IGNORECASE)


def _link_target(source: str, href: str) -> str | None:
    """Repository path a relative markdown link in ``source`` points to."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.IGNORECASE) or href.startswith(("/", "#")):
        return None
    path = unquote(href.split("#", 1)[0].split("?", 1)[0])
    if not path:
        return None
    if path.endswith("/"):
        path += "index.md"
    elif not posixpath.splitext(path)[1]:
        path += ".md"
    return posixpath.normpath(posixpath.join(posixpath.dirname(source), path))


def dead_links(files: Mapping[str, str]) -> list[str]:
    """Relative links in index files whose target is not in ``files``.

    Args:
        files: repository path → text; the values of non-index files are ignored.

    Returns:
        Sorted ``"<index path> -> <missing path>"`` strings, e.g.
        ``["ko/tech/index.md -> ko/tech/gone.md"]``; empty when every link in every
        ``index.md`` resolves. Links without an extension get ``.md`` (VitePress
        style); absolute URLs, ``/``-rooted links and anchors are not checked.
    """
    missing: set[str] = set()
    for path, text in files.items():
        if posixpath.basename(path) != "index.md":
            continue
        for match in _LINK.finditer(text):
            target = _link_target(path, match.group(1))
            if target is not None and target not in files:
                missing.add(f"{path} -> {target}")
    return sorted(missing)


def referenced_images(markdown: str) -> set[str]:
    """Repository paths of images a document shows.

    ``![alt](/images/a.png)`` and ``<img src="/images/a.png">`` map to
    ``public/images/a.png`` (VitePress serves ``public/`` at ``/``). Relative and
    external image URLs are ignored.
    """
    urls = _IMAGE_MD.findall(markdown) + _IMAGE_HTML.findall(markdown)
    return {"public" + unquote(url.split("#", 1)[0].split("?", 1)[0]) for url in urls}


def post_files(files: Mapping[str, str], slug: str) -> list[str]:
    """Paths in ``files`` that hold post ``slug``: published and draft, every language."""
    candidates = [post_path(lang, slug) for lang in LANGS]
    candidates += [draft_path(lang, slug) for lang in LANGS]
    return [path for path in candidates if path in files]


def orphan_images(files: Mapping[str, str], slug: str) -> list[str]:
    """Images that only post ``slug`` uses, so deleting the post may delete them.

    Args:
        files: repository path → text (image values are ignored; they only need
            to be present as keys).
        slug: the post.

    Returns:
        Sorted paths under ``public/images/`` that exist in ``files``, are shown by
        one of the post's files (:func:`post_files`) and by no other ``.md`` file.
    """
    own = set(post_files(files, slug))
    used: set[str] = set()
    for path in own:
        used |= referenced_images(files[path])
    elsewhere: set[str] = set()
    for path, text in files.items():
        if path.endswith(".md") and path not in own:
            elsewhere |= referenced_images(text)
    return sorted(path for path in used - elsewhere if path in files)


# ----------------------------------------------------------------- changesets


@dataclass(frozen=True)
class Changeset:
    """Everything one commit changes.

    Attributes:
        updates: path → new full text (UTF-8) of files to create or overwrite.
        deletes: paths to remove; a path absent from the repository is ignored by
            publishers.
        message: the commit message.

    Raises:
        ValueError: (at construction) when a path is both updated and deleted.
    """

    updates: dict[str, str] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    message: str = ""

    def __post_init__(self) -> None:
        both = set(self.updates) & set(self.deletes)
        if both:
            raise ValueError(f"paths both updated and deleted: {sorted(both)}")

    @property
    def is_empty(self) -> bool:
        """True when applying it changes nothing (publishers then make no commit)."""
        return not self.updates and not self.deletes

    @property
    def paths(self) -> set[str]:
        """Every path the changeset touches."""
        return set(self.updates) | set(self.deletes)

    def applied_to(self, files: Mapping[str, str]) -> dict[str, str]:
        """The files after this changeset, computed in memory (no repository)."""
        result = {path: text for path, text in files.items() if path not in self.deletes}
        result.update(self.updates)
        return result


def _changed(files: Mapping[str, str], updates: Mapping[str, str]) -> dict[str, str]:
    return {path: text for path, text in updates.items() if files.get(path) != text}


def _present(files: Mapping[str, str], paths: Iterable[str]) -> list[str]:
    return [path for path in paths if path in files]


def publish_changes(
    existing_files: Mapping[str, str], post: Post, bodies: Mapping[str, str]
) -> Changeset:
    """The one commit that publishes ``post``.

    Args:
        existing_files: the repository now (path → text).
        post: the post (see :func:`make_post`).
        bodies: markdown per language; ``"ko"``, ``"en"`` and ``"ja"`` are required.

    Returns:
        Updates of the three post files and the three index tables (a row added or
        refreshed), plus deletes of draft copies of the slug. Files whose text
        would not change are left out, so publishing the same post twice yields an
        empty changeset the second time.

    Raises:
        ValueError: when a language body is missing.
    """
    missing = [lang for lang in LANGS if lang not in bodies]
    if missing:
        raise ValueError(f"missing bodies for languages: {missing}")
    updates: dict[str, str] = {}
    for lang in LANGS:
        updates[post_path(lang, post.slug)] = render_post_file(post, lang, bodies[lang])
        updates[index_path(lang)] = add_index_row(existing_files.get(index_path(lang)), post, lang)
    return Changeset(
        updates=_changed(existing_files, updates),
        deletes=_present(existing_files, (draft_path(lang, post.slug) for lang in LANGS)),
        message=f"Publish {post.slug}\n\n{post.title('ko')}\n",
    )


def _without_rows(existing_files: Mapping[str, str], slug: str) -> dict[str, str]:
    updates = {
        index_path(lang): remove_index_row(existing_files[index_path(lang)], slug)
        for lang in LANGS
        if index_path(lang) in existing_files
    }
    return _changed(existing_files, updates)


def delete_changes(existing_files: Mapping[str, str], slug: str) -> Changeset:
    """The one commit that deletes post ``slug`` without leaving a dead link.

    Args:
        existing_files: the repository now (path → text).
        slug: the post.

    Returns:
        Deletes of the post's files (published and draft, all languages) and of
        its orphan images (:func:`orphan_images`), and updates of the index tables
        without the post's rows. Empty when nothing of the post exists.
    """
    return Changeset(
        updates=_without_rows(existing_files, slug),
        deletes=post_files(existing_files, slug) + orphan_images(existing_files, slug),
        message=f"Delete {slug}\n",
    )


def unpublish_changes(existing_files: Mapping[str, str], slug: str) -> Changeset:
    """The one commit that turns post ``slug`` back into a draft.

    Args:
        existing_files: the repository now (path → text).
        slug: the post.

    Returns:
        Each published file moved to ``drafts/<lang>/<slug>.md`` (same text) and
        the post's index rows removed; images stay. Empty when the post is not
        published.
    """
    published = _present(existing_files, (post_path(lang, slug) for lang in LANGS))
    updates = _without_rows(existing_files, slug)
    for lang in LANGS:
        if post_path(lang, slug) in published:
            updates[draft_path(lang, slug)] = existing_files[post_path(lang, slug)]
    return Changeset(
        updates=_changed(existing_files, updates),
        deletes=published,
        message=f"Unpublish {slug}\n",
    )
