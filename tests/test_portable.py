"""A Python worker that Spark reuses loads many of the connector's pickles: each may add the
package's folder to ``sys.path``, once in all."""

from __future__ import annotations

import pickle
import subprocess
import sys

from spark_queue.portable import ROOT
from spark_queue.storage.browse import BrowsePartition
from spark_queue.storage.location import Location


def test_a_worker_loading_many_portable_pickles_has_the_package_folder_on_its_path_once():
    part = BrowsePartition(Location("/nowhere", {}), "q", 0, 0, [], [], {}, [], 0)
    loads = (
        "import pickle, sys\n"
        f"data, root = {pickle.dumps(part)!r}, {ROOT!r}\n"
        "before = list(sys.path)\n"
        "found = [pickle.loads(data) for _ in range(100)]\n"
        "others = [p for p in sys.path if p != root] == [p for p in before if p != root]\n"
        "print(type(found[-1]).__name__, sys.path.count(root), others)\n"
    )
    done = subprocess.run([sys.executable, "-c", loads], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["BrowsePartition", "1", "True"]
