"""One version string: the file VERSION. CMake compiles it into the library
(attn::version(), which the extension returns), pyproject.toml has the wheel
read it, and nothing else writes a version."""

import pathlib
import re
import tomllib

import attn

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_version_is_the_version_file():
    version = (ROOT / "VERSION").read_text().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert attn.__version__ == version
    assert attn._attn.version() == version


def test_pyproject_reads_the_version_file():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    provider = project["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["input"] == "VERSION"
    # scikit-build-core's regex provider takes the group "value" of the first match.
    match = re.search(provider["regex"], (ROOT / "VERSION").read_text())
    assert match and match.group("value") == attn.__version__


def test_no_other_file_writes_the_version():
    version = attn.__version__
    for path in ("CMakeLists.txt", "pyproject.toml", "python/attn/__init__.py"):
        text = (ROOT / path).read_text()
        assert f'"{version}"' not in text and f"VERSION {version}" not in text, path
