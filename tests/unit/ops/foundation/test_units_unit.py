"""The unit half of tests/integration/ops/foundation/test_units.py (its tests that need no process, socket or server); the pair's subject:
The one size parser and formatter: decimal and binary units mean what they say, guesses are refused."""

from __future__ import annotations

import pytest

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import fmt_bytes, fmt_used_of, parse_size


@pytest.mark.parametrize("text, expected", [
    ("14GiB", 14 * 2 ** 30), ("14GB", 14 * 10 ** 9), ("14 gb", 14 * 10 ** 9), ("14gib", 14 * 2 ** 30),
    ("512Mi", 512 * 2 ** 20), ("1.5TiB", 3 * 2 ** 39), ("64kB", 64_000), ("2_048MiB", 2 ** 31), ("0", 0),
    ("100B", 100), (4096, 4096),
])
def test_units_mean_what_they_say(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, needle, hint", [
    ("24", "it has no unit", "24GiB (2^30 bytes each), 24GB (10^9)"),
    ("24G", "G alone could mean GiB or GB", "24GiB (binary, 2^30) or 24GB (decimal, 10^9)"),
    ("512m", "M alone could mean MiB or MB", "512MiB"),
    ("24XB", "unknown unit 'XB'", "24GiB"),
    ("1.2.3", "cannot read size", "24GB"),
    ("", "cannot read size", "512MiB"),
    ("-1GiB", "cannot read size", "24GiB"),
])
def test_guesses_are_refused_with_what_to_write(text, needle, hint):
    with pytest.raises(GpuwardenError) as err:
        parse_size(text)
    assert needle in err.value.message and hint in err.value.hint


def test_a_bare_number_is_bytes_only_where_the_option_says_so():
    assert parse_size("4096", bare_bytes=True) == 4096
    assert parse_size("4KiB", bare_bytes=True) == 4096


def test_human_output_is_binary():
    assert fmt_bytes(14 * 2 ** 30) == "14.0 GiB" and fmt_bytes(14 * 10 ** 9) == "13.0 GiB"
    assert fmt_bytes(500) == "500 B" and fmt_bytes(None) == "-"
    assert fmt_bytes(14 * 2 ** 30, compact=True) == "14.0Gi" and fmt_bytes(512 * 2 ** 20, compact=True) == "512Mi"
    assert fmt_used_of(12 * 2 ** 30, 24 * 2 ** 30) == "12.0/24Gi" and fmt_used_of(None, 1) == "-"


def test_the_kernels_sizes_have_their_own_reader():
    from gpuwarden.ops.foundation.units import parse_kernel_size
    assert parse_kernel_size("1048576k") == 1 << 30 and parse_kernel_size("2G") == 2 << 30
    assert parse_kernel_size("4096") == 4096
    with pytest.raises(GpuwardenError):
        parse_kernel_size("2GiB")


def test_size_arg_gives_a_size_back_in_the_unit_that_divides_it():
    # The arena's recreate hint said `--size 268435456B` (issue 36): a size a person reads, and parse_size's inverse.
    from gpuwarden.ops.foundation.units import parse_size, size_arg
    assert size_arg(268435456) == "256MiB" and size_arg(64 << 30) == "64GiB" and size_arg(1536 << 20) == "1536MiB"
    assert size_arg(5000) == "5000B" and size_arg(0) == "0B" and size_arg(4096) == "4KiB"
    for n in (1, 4095, 4096, 268435456, (1 << 40) + (1 << 20), 3 << 50):
        assert parse_size(size_arg(n)) == n
