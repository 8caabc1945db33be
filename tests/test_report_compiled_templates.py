"""The report's compiled templates are kept in the cache for the next run: reused while the template and what
compiles it are unchanged, compiled again when either changes, and never the reason a report fails."""

from __future__ import annotations

from pathlib import Path

import jinja2

from bench.report import COMPILED_TEMPLATES, _compiled_templates, template_environment

TEMPLATE = "page.md.j2"


def rendered(templates: Path, cache: Path) -> str:
    """The page as a fresh environment (a new run) renders it."""
    return template_environment(templates, cache).get_template(TEMPLATE).render(n=7)


def entries(cache: Path) -> list[Path]:
    return sorted((cache / COMPILED_TEMPLATES).glob("*/*.cache"))


def templates_with(tmp_path: Path, source: str) -> Path:
    folder = tmp_path / "templates"
    folder.mkdir(exist_ok=True)
    (folder / TEMPLATE).write_text(source)
    return folder


def test_a_second_run_reuses_the_compiled_template(tmp_path: Path) -> None:
    templates, cache = templates_with(tmp_path, "{% if n %}\nn is {{ n }}\n{% endif %}\n"), tmp_path / "cache"
    assert rendered(templates, cache) == "n is 7\n"  # trim_blocks: no line of its own for a block tag
    [entry] = entries(cache)
    inode = entry.stat().st_ino

    assert rendered(templates, cache) == "n is 7\n"
    # An entry is replaced (a new file) only when its template was compiled again.
    assert [(path, path.stat().st_ino) for path in entries(cache)] == [(entry, inode)]


def test_a_changed_template_is_compiled_again_not_served_from_the_cache(tmp_path: Path) -> None:
    templates, cache = templates_with(tmp_path, "one {{ n }}"), tmp_path / "cache"
    assert rendered(templates, cache) == "one 7"
    [entry] = entries(cache)
    inode = entry.stat().st_ino

    templates_with(tmp_path, "two {{ n }}")
    assert rendered(templates, cache) == "two 7"
    assert entries(cache) == [entry] and entry.stat().st_ino != inode


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path: Path) -> None:
    templates, cache = templates_with(tmp_path, "one {{ n }}"), tmp_path / "cache"
    rendered(templates, cache)
    [entry] = entries(cache)
    cut = len(jinja2.bccache.bc_magic) + 5  # inside the source checksum that follows Jinja's header
    entry.write_bytes(entry.read_bytes()[:cut])

    assert rendered(templates, cache) == "one 7"
    assert entry.stat().st_size > cut  # written again, whole


def test_a_cache_that_cannot_be_written_renders_all_the_same(tmp_path: Path) -> None:
    templates, not_a_directory = templates_with(tmp_path, "one {{ n }}"), tmp_path / "cache"
    not_a_directory.write_text("a file where the cache directory would be")

    assert rendered(templates, not_a_directory) == "one 7"
    assert not_a_directory.read_text() == "a file where the cache directory would be"


def test_what_compiles_a_template_names_its_cache_directory(tmp_path: Path) -> None:
    def directory(**options: bool) -> str:
        cache = _compiled_templates(jinja2.Environment(**options), tmp_path)  # type: ignore[arg-type]
        assert isinstance(cache, jinja2.FileSystemBytecodeCache)
        return cache.directory

    assert directory(trim_blocks=True) == directory(trim_blocks=True)
    assert len({directory(), directory(trim_blocks=True), directory(lstrip_blocks=True)}) == 3
