"""The README is a front page and docs/ the reference: what a newcomer reads stays short, every
page it points to exists, and the settings reference names every setting."""

from __future__ import annotations

import re

from pipelines.config.settings import setting_keys
from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines)
    for section in ("## Quick start", "## Commands", '## What "exactly once" covers', "## Read more"):
        assert section in text, section


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    assert len(pages) >= 11  # the README and a page per topic
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png))(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page.name} links to {target}"


def test_the_settings_reference_names_every_setting() -> None:
    text = (DOCS / "settings.md").read_text()
    missing = [key for key in setting_keys() if f"`{key}`" not in text]
    assert missing == [], f"docs/settings.md lacks {missing}"


def test_exactly_once_says_what_it_covers_and_what_it_does_not() -> None:
    text = README.read_text()
    section = text[text.index('## What "exactly once" covers') :].split("\n## ", 1)[0]
    for covered in ("**Kafka**", "**Files**", "**Remote write**"):
        assert covered in section
    assert "does **not** cover" in section and "`uuid`" in section


def test_the_tables_page_lists_every_table() -> None:
    import pipelines.runtime.tables as tables
    from pipelines.storage.specs import TableSpec

    text = (DOCS / "tables.md").read_text()
    keys = sorted(v.key for v in vars(tables).values() if isinstance(v, TableSpec))
    assert len(keys) >= 20
    assert [k for k in keys if f"| `{k}` |" not in text] == []


def test_the_performance_page_shows_current_results_not_their_history() -> None:
    text = (DOCS / "performance.md").read_text()
    for section in ("## How to reproduce", "## How to read the peers", "## Current results"):
        assert section in text, section
    for history in ("How it got here", "What bought it", "What each change bought", "starting point", "| before |"):
        assert history not in text, history
