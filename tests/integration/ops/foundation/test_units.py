"""The one size parser and formatter: decimal and binary units mean what they say, guesses are refused."""

from __future__ import annotations




def test_cli_sizes_go_through_the_one_parser(cli):
    proc = cli("sim", "init", "--vram", "24G")
    assert proc.returncode == 2 and "G alone could mean GiB or GB" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("sim", "init", "--gpus", "1", "--vram", "24GB")
    assert proc.returncode == 0 and "22.4 GiB" in proc.stdout, proc.stdout + proc.stderr
