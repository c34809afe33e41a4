"""The README's configuration table is the operator's reference: every environment variable the settings
read has a row in it."""

import os
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


# getattr(settings, "NAME", default) in the code: a setting that no settings module declares cannot come
# from the environment, whatever the README says.
SETTING_LOOKUP = re.compile(r"getattr\(\s*settings,\s*\"([A-Z][A-Z0-9_]*)\"")


def test_every_setting_the_code_looks_up_is_declared_in_the_settings_so_the_environment_can_set_it():
    looked_up = set()
    for folder in ("portal", "provisioning"):
        for path in (ROOT / folder).rglob("*.py"):
            looked_up |= set(SETTING_LOOKUP.findall(path.read_text()))
    declared = set()
    for path in (ROOT / "portal" / "settings").glob("*.py"):
        declared |= set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", path.read_text(), flags=re.MULTILINE))
    undeclared = sorted(looked_up - declared)

    assert looked_up, "the code looks up no settings: the pattern above is wrong"
    assert not undeclared, f"settings read by the code but declared nowhere: {', '.join(undeclared)}"


def test_the_host_helper_image_comes_from_the_environment():
    import subprocess
    import sys

    probe = "import django; django.setup(); from provisioning.hostfs import helper_image; print(helper_image())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings.test", "DEVCLOUD_HOST_HELPER_IMAGE": "debian:bookworm-slim"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "debian:bookworm-slim"



def test_no_variable_has_two_rows_in_the_readme_table():
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    twice = sorted({name for name in rows if rows.count(name) > 1})

    assert not twice, f"README.md's configuration table has two rows for: {', '.join(twice)}"
