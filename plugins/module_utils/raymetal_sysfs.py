# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Reading sysfs (or a fixture tree shaped like it): one concern, no Ansible imports."""

from __future__ import annotations

import os
import re


def natural_key(name):
    """Sort ib2 before ib10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read_text(path):
    """Return the stripped content of a sysfs file, or None if unreadable."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def list_dir(path):
    """Entries of a directory in natural order, or [] if it does not exist."""
    try:
        return sorted(os.listdir(path), key=natural_key)
    except OSError:
        return []


def read_int(path, base=10):
    """Integer content of a sysfs file (base 16 accepts 0x...), or None."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None
