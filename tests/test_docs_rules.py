"""Every rule or property code the project cites (C1, R4, P7, ...) is defined in docs/rules.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES_DOC = ROOT / "docs" / "rules.md"
CODE = re.compile(r"\b(?:[CRKP]\d|S\d\d)\b")
# A definition is a bold lead-in at the start of a line: "**R1 — the fence.**"
DEFINITION = re.compile(r"^\*\*([CRKP]\d|S\d\d) — ", re.MULTILINE)


def defined_codes(text: str) -> set[str]:
    return set(DEFINITION.findall(text))


def cited_codes(paths: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Code -> the files (relative to the repository) that cite it."""
    cited: dict[str, list[str]] = {}
    for path in paths:
        for code in sorted(set(CODE.findall(path.read_text(errors="replace")))):
            cited.setdefault(code, []).append(str(path.relative_to(root)))
    return cited


def project_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in {".md", ".txt", ".rst"})
    files += sorted((ROOT / "src").rglob("*.py"))
    return files


def undefined(paths: list[Path], rules_text: str, root: Path = ROOT) -> dict[str, list[str]]:
    defined = defined_codes(rules_text)
    return {code: where for code, where in cited_codes(paths, root).items() if code not in defined}


def test_every_cited_code_is_defined():
    missing = undefined(project_files(), RULES_DOC.read_text())
    assert not missing, f"codes used but not defined in docs/rules.md: {missing}"


def test_the_rules_page_defines_each_code_once():
    text = RULES_DOC.read_text()
    found = DEFINITION.findall(text)
    assert len(found) == len(set(found)), sorted(c for c in found if found.count(c) > 1)
    expected = {f"C{i}" for i in range(1, 6)} | {f"R{i}" for i in range(1, 7)} | {f"K{i}" for i in range(1, 4)}
    expected |= {f"P{i}" for i in range(1, 10)}
    assert set(found) - {c for c in found if c.startswith("S")} == expected
    # Scenarios are defined as the tests stage them; every rule also has its row of tests.
    assert {"S01", "S04", "S05", "S16", "S17", "S19", "S20"} <= set(found)
    table = text[text.index("## Where each rule is proven"):]
    assert all(re.search(rf"\b{code}\b", table) or code[0] == "P" for code in expected)


def test_control_an_undefined_code_is_caught(tmp_path):
    """Control: a file citing a code the page lacks is reported, with the file that cites it."""
    doc = tmp_path / "README.md"
    doc.write_text("Checked under K7, and under R1.\n")
    missing = undefined([doc], RULES_DOC.read_text(), root=tmp_path)
    assert missing == {"K7": ["README.md"]}
    # and removing a definition from the page makes a cited code undefined
    without_r1 = re.sub(r"^\*\*R1 — .*$", "", RULES_DOC.read_text(), flags=re.MULTILINE)
    assert "R1" in undefined(project_files(), without_r1)
