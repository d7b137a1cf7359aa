"""Seeds of the randomised tests: fixed by default, replayable, random only when asked.

``SPARK_QUEUE_TEST_SEED`` decides them for a whole run:

- unset: every randomised test uses a fixed seed of its own (derived from its name), and
  Hypothesis runs derandomised with no example database. This is what CI runs, so a run
  that passed passes again on the same code;
- a whole number: that seed, for the randomised tests and for Hypothesis: replays a run;
- ``random``: new seeds, drawn per test, to explore (``make stress``).

Each randomised test prints its seed, and a failing one prints the command that replays it
(``tests/conftest.py``).
"""

from __future__ import annotations

import os
import random
import zlib

ENV_VAR = "SPARK_QUEUE_TEST_SEED"
RANDOM = "random"
SEED_LIMIT = 2**32


def seed_mode() -> int | str | None:
    """The run's setting: None (fixed seeds), a seed, or :data:`RANDOM`.

    Raises:
        ValueError: ``SPARK_QUEUE_TEST_SEED`` is neither a whole number >= 0 nor ``random``.
    """
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value.lower() == RANDOM:
        return RANDOM
    if value.isdigit():
        return int(value)
    raise ValueError(f"{ENV_VAR} must be a whole number >= 0 or '{RANDOM}', not {value!r}")


def seed_for(test_id: str) -> int:
    """The seed of one randomised test in this run."""
    mode = seed_mode()
    if mode is None:
        return zlib.crc32(test_id.encode())  # fixed: the same test gets the same seed
    if mode == RANDOM:
        return random.SystemRandom().randrange(SEED_LIMIT)
    return int(mode)


def replay_command(seed: int, node_id: str) -> str:
    """What a person runs to repeat one test with its seed."""
    return f"{ENV_VAR}={seed} .venv/bin/python -m pytest -s '{node_id}'"
