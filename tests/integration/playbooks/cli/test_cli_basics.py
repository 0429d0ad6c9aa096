"""The CLI's front door: --help, --version, one-line errors for bad global options."""

from helpers.cli import gpuwarden


def test_help_lists_commands():
    proc = gpuwarden("--help", check=True)
    assert "Usage: gpuwarden" in proc.stdout
    assert "--state-dir" in proc.stdout and "GPUWARDEN_STATE_DIR" in proc.stdout


def test_version():
    from gpuwarden.ops import __version__
    proc = gpuwarden("--version", check=True)
    assert proc.stdout.strip() == f"gpuwarden {__version__}"


def test_unknown_backend_is_one_line(tmp_path):
    proc = gpuwarden("--state-dir", str(tmp_path), "--backend", "cuda", "tui")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown backend 'cuda'" in proc.stderr
