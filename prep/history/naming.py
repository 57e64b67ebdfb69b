"""How `--at` names a shard artifact, in both naming schemes (light: no numpy, for CLI help)."""

from __future__ import annotations

from prep.formats.units import KEY_NAME_DIGITS, artifact_path, named_artifact_path, units

_EXAMPLE = units()[0].format_names[0]
AT_EXAMPLES = (f"{named_artifact_path(_EXAMPLE, '0' * KEY_NAME_DIGITS)}:0 (shards named by key range) or "
               f"{artifact_path(_EXAMPLE, 0)}:0 (older snapshots, shards named by position)")
"""Examples of `--at PATH:N` values for both shard naming schemes."""
KEY_HEX_DIGITS = 32
"""Hex digits of a layout-2 WebDataset sample key (a 128-bit order key)."""
