"""Small file helpers shared by the data, training and evaluation code."""

import json
import os
from typing import Any


def write_json(path: str, obj: Any) -> None:
  """Writes `obj` as JSON to `path` atomically (a temporary file, then a rename)."""
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write('\n')
  os.replace(tmp, path)
