"""The README is the way in and docs/index.md lists every page: no page unreachable, no dead link."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGE_REF = re.compile(r"docs/([A-Za-z0-9_\-]+\.md)")


def _index_links() -> list[str]:
    return re.findall(r"\]\(([^)#]+\.md)\)", (DOCS / "index.md").read_text())


def test_index_lists_every_page_and_only_pages_that_exist():
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    linked = _index_links()
    assert len(linked) == len(set(linked)), "a page is listed twice in docs/index.md"
    missing = sorted(pages - set(linked))
    dead = sorted(set(linked) - pages)
    assert not missing, f"docs/index.md does not list {missing}"
    assert not dead, f"docs/index.md links pages that do not exist: {dead}"


def test_readme_is_short_and_points_at_the_index():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "the README is the way in: keep it to about 200 lines"
    assert "docs/index.md" in readme
    # the way in: the two quickstart commands come before any other section
    first_section = readme.split("\n## ")[1]
    assert first_section.startswith("Quickstart")


def test_every_docs_page_named_anywhere_exists():
    """README, docs, studies and the code name pages as docs/<page>.md: each must exist."""
    files = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "studies").glob("*.yaml"),
             *(ROOT / "coreecg").rglob("*.py"), *(ROOT / "jobs").glob("*.py")]
    dead = sorted({f"{f.relative_to(ROOT)}: docs/{name}" for f in files
                   for name in PAGE_REF.findall(f.read_text()) if not (DOCS / name).exists()})
    assert not dead, f"references to pages that do not exist: {dead}"


def test_readme_gives_every_database_a_download_address_and_a_build_command():
    readme = (ROOT / "README.md").read_text()
    for source in ("ptbxl", "cpsc2018", "cinc2021", "mimic-iv-ecg", "code15"):
        assert f"--source {source}" in readme, source
    for address in ("physionet.org/content/ptb-xl", "physionet.org/content/challenge-2021",
                    "physionet.org/content/mimic-iv-ecg", "zenodo.org/records/4916206"):
        assert address in readme, address


def test_every_job_and_benchmark_is_named_where_users_look():
    """docs/layout.md names every job, docs/bench.md every benchmark script."""
    layout, bench = (DOCS / "layout.md").read_text(), (DOCS / "bench.md").read_text()
    jobs = sorted(p.name for p in (ROOT / "jobs").glob("*.py") if p.stem != "__init__")
    benches = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in ("__init__", "common"))
    assert [j for j in jobs if j not in layout] == []
    assert [b for b in benches if f"bench.{b}" not in bench] == []
