"""The README's configuration table is the operator's reference: every environment variable the settings
read has a row in it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# env("NAME", ...), env.int("NAME", ...), env.db("NAME", ...) and the like.
SETTING_READ = re.compile(r"\benv(?:\.[a-z_]+)?\(\s*\"([A-Z][A-Z0-9_]*)\"")


def settings_variables() -> set[str]:
    names = set()
    for path in (ROOT / "portal" / "settings").glob("*.py"):
        names |= set(SETTING_READ.findall(path.read_text()))
    return names


def readme_table_variables() -> set[str]:
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", (ROOT / "README.md").read_text(), flags=re.MULTILINE))


def test_every_environment_variable_the_settings_read_has_a_row_in_the_readme_table():
    missing = sorted(settings_variables() - readme_table_variables())

    assert not missing, f"README.md's configuration table has no row for: {', '.join(missing)}"


def test_the_settings_really_read_variables_so_the_check_above_checks_something():
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= settings_variables()


def test_every_file_the_readme_cites_is_in_the_repository():
    text = (ROOT / "README.md").read_text()
    cited = set(re.findall(r"`((?:tests|portal|provisioning|docs|deploy|scripts|containers|benchmarks)/[\w./-]+?)(?:::\w+)?`", text))
    missing = sorted(path for path in cited if not (ROOT / path).exists())

    assert cited, "the README cites no files: the pattern above is wrong"
    assert not missing, f"README.md cites files that do not exist: {', '.join(missing)}"
