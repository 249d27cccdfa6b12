"""MkDocs hook: a repository file that a page links to outside docs/ (benchmarks/README.md, the figures under
benchmarks/results/, gradcache/train/README.md) is copied into the site under `repository/`, so the relative
links that work on a code host work in the site too. A link whose target does not exist stays broken, and
`mkdocs build --strict` fails on it as on a broken link between two pages."""
from __future__ import annotations

import os
import posixpath
import re

from mkdocs.structure.files import File, Files, InclusionLevel

LINK = re.compile(r"\]\(([^)#\s]+)")  # the target of a Markdown link or image, without its anchor


class RepositoryFile(File):
    """A file outside docs/, copied as it is (a Markdown file is not rendered: its own links are not the site's)."""

    def is_documentation_page(self) -> bool:
        return False


def on_files(files: Files, config) -> Files:
    docs = config.docs_dir
    for page in list(files.documentation_pages()):
        for target in LINK.findall(page.content_string):
            uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri), target))
            outside = uri.startswith("../") and not uri.startswith("../docs/")
            if outside and files.get_file_from_path(uri) is None and os.path.isfile(os.path.join(docs, uri)):
                files.append(RepositoryFile(uri, docs, config.site_dir, config.use_directory_urls,
                                            dest_uri="repository/" + uri[len("../"):],
                                            inclusion=InclusionLevel.INCLUDED))
    return files
