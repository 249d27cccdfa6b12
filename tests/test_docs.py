"""The docs state the code's API and reach every page: each signature in docs/api.md equals `inspect.signature` of
the object it names, README.md stays a short front page that links to every docs page, and mkdocs.yml's nav
lists every page (CI builds the site with `mkdocs build --strict`, which checks the links)."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
README_LINES = 220


def documented_signatures() -> list[str]:
    """Each statement of a python block in docs/api.md that starts with `gradcache.`: one signature, maybe over
    several lines (until its brackets close)."""
    signatures = []
    for block in FENCE.findall((DOCS / "api.md").read_text()):
        current, depth = "", 0
        for line in block.splitlines():
            if not current and not line.startswith("gradcache."):
                continue
            current += line.strip() + " "
            depth += line.count("(") + line.count("[") - line.count(")") - line.count("]")
            if depth == 0:
                signatures.append(current.strip())
                current = ""
    return signatures


def parsed(signature: str) -> tuple[str, ast.arguments, ast.expr | None]:
    """(dotted name, parameters, return annotation) of `name(parameters) -> annotation`."""
    name, rest = signature.split("(", 1)
    function = ast.parse(f"def _({rest}: pass").body[0]
    return name, function.args, function.returns


def resolved(name: str) -> tuple[object, bool]:
    """The object a dotted name names, and whether it is a method (its `self` is not written in the docs)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as error:
            if error.name and not ".".join(parts[:split]).startswith(error.name):  # an optional package is missing
                pytest.skip(f"{name}: {error.name} is not installed")
            continue
        except ImportError as error:  # an integration names the extra that brings its trainer
            pytest.skip(f"{name}: {error}")
        target, owner = module, None
        for attribute in parts[split:]:
            owner, target = target, getattr(target, attribute)
        return target, inspect.isclass(owner)
    raise AssertionError(f"no module in {name}")


def normal(source: str | None) -> str | None:
    return None if source is None else ast.unparse(ast.parse(source, mode="eval"))


def written(arguments: ast.arguments) -> list[tuple[str, str, str | None, str | None]]:
    """(kind, name, annotation, default) of each parameter as the docs write it."""
    rows = []
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    for index, (argument, default) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if index < len(arguments.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        rows.append((kind, argument.arg, argument.annotation, default))
    if arguments.vararg:
        rows.append(("VAR_POSITIONAL", arguments.vararg.arg, arguments.vararg.annotation, None))
    for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        rows.append(("KEYWORD_ONLY", argument.arg, argument.annotation, default))
    if arguments.kwarg:
        rows.append(("VAR_KEYWORD", arguments.kwarg.arg, arguments.kwarg.annotation, None))
    return [(kind, name, annotation and ast.unparse(annotation), default and ast.unparse(default))
            for kind, name, annotation, default in rows]


def actual(signature: inspect.Signature, method: bool) -> list[tuple[str, str, str | None, str | None]]:
    parameters = list(signature.parameters.values())[1 if method else 0:]
    return [(p.kind.name, p.name, None if p.annotation is p.empty else normal(str(p.annotation)),
             None if p.default is p.empty else normal(repr(p.default))) for p in parameters]


SIGNATURES = documented_signatures()


def test_the_api_page_documents_every_public_name():
    import gradcache
    import gradcache.losses

    text = (DOCS / "api.md").read_text()
    names = {n for n in gradcache.__all__ if n != "losses"} | set(gradcache.losses.__all__)
    assert not {n for n in names if f"`gradcache.{n}" not in text and f"gradcache.losses.{n}(" not in text
                and f"gradcache.{n}(" not in text}
    assert len(SIGNATURES) >= 30


@pytest.mark.parametrize("signature", SIGNATURES, ids=[s.split("(")[0] for s in SIGNATURES])
def test_a_documented_signature_is_the_code_s(signature):
    name, arguments, returns = parsed(signature)
    if name.startswith("gradcache.models."):  # the encoders install with the train extra (torchvision)
        pytest.importorskip("gradcache.models", reason='the encoders come with pip install ".[train]"')
    target, method = resolved(name)
    code = inspect.signature(target)
    assert written(arguments) == actual(code, method), f"docs/api.md: {signature}\n    code: {name}{code}"
    if returns is not None:  # written only where it helps the reader
        assert ast.unparse(returns) == normal(str(code.return_annotation)), (signature, code)


def test_a_drifted_signature_fails():
    name, arguments, _ = parsed("gradcache.losses.EmbeddingQueue(size: int, warmup: int = 1)")
    target, method = resolved(name)
    assert written(arguments) != actual(inspect.signature(target), method)


def test_the_readme_is_a_short_front_page_that_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert len(pages) >= 7
    assert not [p for p in pages if f"](docs/{p})" not in readme and f"](docs/{p}#" not in readme]
    assert "\npython -m pytest tests\n" in readme  # the command CI runs verbatim (.ci/run)


def test_the_readme_quickstart_runs_as_pasted():
    quickstart = FENCE.findall((ROOT / "README.md").read_text())[0]
    exec(compile(quickstart, "README.md quickstart", "exec"), {})


def slug(heading: str) -> str:
    """A heading's anchor, as a code host and MkDocs both make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_readmes_and_pages_reaches_its_file_and_heading():
    """MkDocs checks the links between pages; this checks those it does not build: the READMEs' links and the
    pages' links to files outside docs/, each anchor included."""
    sources = [ROOT / "README.md", ROOT / "gradcache" / "train" / "README.md", ROOT / "benchmarks" / "README.md",
               *DOCS.glob("*.md")]
    broken = []
    for source in sources:
        text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (source.parent / path).resolve() if path else source
            if not file.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", file.read_text(), flags=re.S | re.M),
                                      flags=re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{source.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken


def test_every_docs_page_is_in_the_site_s_nav():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w-]+\.md)", nav))
    assert {p.name for p in DOCS.glob("*.md")} <= listed
    assert listed <= {p.name for p in DOCS.glob("*.md")}


def test_no_file_holds_a_merge_conflict_marker():
    """A conflict resolved by hand leaves no `<<<<<<<` / `>>>>>>>` line in a page, module or config (a page renders
    it silently)."""
    suffixes = {".py", ".md", ".toml", ".yml", ".yaml", ".json", ".cfg", ".txt"}
    found = []
    for path in ROOT.rglob("*"):
        if path.suffix in suffixes and path.is_file() and not {".git", "site", ".venv"} & set(path.parts):
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(ROOT)}:{number}" for number, line in enumerate(text.splitlines(), 1)
                      if line.startswith(("<<<<<<< ", ">>>>>>> "))]
    assert not found, found


def test_every_page_closes_its_code_blocks():
    """An unclosed fence turns the rest of a page into code: its headings, and the anchors pages link to, vanish."""
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    unclosed = [str(page.relative_to(ROOT)) for page in pages
                if sum(line.lstrip().startswith("```") for line in page.read_text(encoding="utf-8").splitlines()) % 2]
    assert not unclosed, unclosed
