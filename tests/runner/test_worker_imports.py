"""What a build's tasks import: pandas never (importing it costs each worker about 0.3 s before its
first task finishes; pyarrow's `pa.array` of a numpy array imports it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_records, prep_env, write_jsonl, write_pipeline

BUILD_IN_PROCESS = r"""
import json, sys
from pathlib import Path
from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import build
from prep.storage import open_store
from tests.runner.buildsupport import InProcessExecutor

result = build(load_pipeline(Path(sys.argv[1])), open_store(sys.argv[2]), InProcessExecutor(), progress=Progress(quiet=True))
print(json.dumps({"snapshot": result.snapshot.id, "pandas": "pandas" in sys.modules}))
"""


def test_a_build_s_tasks_never_import_pandas(tmp_path: Path, tokenizer_path: Path) -> None:
    pytest.importorskip("pandas")  # installed here (datasets needs it): the case that costs
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(200, seed=1, prefix="a"))
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(200, seed=2, prefix="b"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus/*.jsonl"], shard_size="4KB")
    ran = subprocess.run([sys.executable, "-c", BUILD_IN_PROCESS, str(pipeline), str(tmp_path / "store")],
                         capture_output=True, text=True, env=prep_env(), cwd=Path(__file__).parents[2], check=False)
    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["snapshot"].startswith("sha256:") and outcome["pandas"] is False
