"""``kvpools serve`` on the command line: without its extra it names the pip install; a bad --models-dir is the
user's error (exit 1, one paragraph), found before the server starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main


def test_without_the_extra_serve_says_which_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpools_core.serve

    monkeypatch.setattr(kvpools_core.serve, "missing_extra", lambda: ["fastapi", "uvicorn"])
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "Error: kvpools serve needs fastapi, uvicorn, from the serve extra: pip install 'kvpools[serve]' "
        "(or pip install -e '.[serve]' from a kvpools checkout).\n"
    )


def test_a_models_dir_that_is_not_a_directory_is_refused_before_serving(tmp_path: Path) -> None:
    from tests.serve.conftest import need_extra

    need_extra()
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(main, ["serve", "--models-dir", str(missing)])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: --models-dir {missing}: not a directory. Pass a directory of model configs.\n"


def test_a_models_dir_entry_may_not_shadow_a_preset(tmp_path: Path) -> None:
    from tests.serve.conftest import need_extra

    need_extra()
    (tmp_path / "llama-3.1-8b.json").write_text("{}")
    result = CliRunner().invoke(main, ["serve", "--models-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "llama-3.1-8b is also a preset's name" in result.stderr
