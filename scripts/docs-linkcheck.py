#!/usr/bin/env python3
"""Check the links of the built manual: every relative link resolves.

    python3 scripts/docs-linkcheck.py [BOOK_DIR]       (default: docs/book)

Parses every HTML file under BOOK_DIR and checks each `href` and `src` that is not external
(no scheme such as https: or mailto:, not protocol-relative): the file it names must exist
under BOOK_DIR, and its `#anchor`, if any, must be an `id` (or an `<a name>`) in that file.
External links are not fetched. It also checks that every repository path the manual's and the
README's text names (`src/.../x.rs`, `tests/x.rs`, `scripts/x.sh`, ...) exists, so a moved file
cannot leave the manual pointing at nothing. Exit status 1, with one line per broken link or
path, if any is broken.
Python 3 standard library only.
"""

import html.parser
import os
import posixpath
import re
import sys
import urllib.parse

EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (line, attribute, value)
        self.base = None

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif tag == "base" and name == "href":
                self.base = value
            elif name in ("href", "src"):
                self.links.append((self.getpos()[0], name, value))

    handle_startendtag = handle_starttag


PATH = re.compile(r"(?<![\w./-])((?:src|tests|scripts|sim|include|config|docs)/[\w./-]*\w\.(?:rs|sh|py|c|h|toml|md))(?![\w])")


def missing_paths(root):
    """Repository paths named in README.md and docs/src/*.md that do not exist."""
    out = []
    texts = [os.path.join(root, "README.md")]
    src = os.path.join(root, "docs", "src")
    texts += [os.path.join(src, f) for f in sorted(os.listdir(src)) if f.endswith(".md")]
    for t in texts:
        with open(t, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                for m in PATH.finditer(line):
                    if not os.path.exists(os.path.join(root, m.group(1))):
                        out.append(f"{os.path.relpath(t, root)}:{n}: names {m.group(1)}, which does not exist")
    return out


def main():
    book = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", "docs", "book"))
    if not os.path.isdir(book):
        print(f"docs-linkcheck: {book} does not exist: build the manual first", file=sys.stderr)
        return 1
    pages = {}
    for dirpath, _, files in os.walk(book):
        for f in files:
            if f.endswith(".html"):
                path = os.path.join(dirpath, f)
                p = Page()
                with open(path, encoding="utf-8") as fh:
                    p.feed(fh.read())
                pages[os.path.relpath(path, book).replace(os.sep, "/")] = p
    broken = []
    checked = 0
    for rel, page in sorted(pages.items()):
        here = posixpath.dirname(rel)
        if page.base is not None and not EXTERNAL.match(page.base):
            # mdBook's 404 page: links are relative to its <base href>, the book's root.
            here = page.base.strip("/")
        for line, attr, value in page.links:
            value = value.strip()
            if not value or EXTERNAL.match(value):
                continue
            checked += 1
            url = urllib.parse.urlsplit(value)
            path = urllib.parse.unquote(url.path)
            if path.startswith("/"):
                target = posixpath.normpath(path.lstrip("/"))
            elif path:
                target = posixpath.normpath(posixpath.join(here, path))
            else:
                target = rel
            if target in ("", "."):
                target = "index.html"
            full = os.path.join(book, target)
            if os.path.isdir(full):
                target = posixpath.join(target, "index.html")
                full = os.path.join(book, target)
            if target.startswith("../") or not os.path.isfile(full):
                broken.append(f"{rel}:{line}: {attr}=\"{value}\": no file {target}")
                continue
            if url.fragment:
                anchor = urllib.parse.unquote(url.fragment)
                dest = pages.get(target)
                if dest is not None and anchor not in dest.ids:
                    broken.append(f"{rel}:{line}: {attr}=\"{value}\": no id \"{anchor}\" in {target}")
    broken += missing_paths(os.path.normpath(os.path.join(book, "..", "..")))
    for b in broken:
        print("docs-linkcheck: broken link: " + b, file=sys.stderr)
    print(f"docs-linkcheck: {len(pages)} pages, {checked} relative links, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
