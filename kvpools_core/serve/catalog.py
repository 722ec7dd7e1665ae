"""The models a running service may plan: presets, entries of ``--models-dir``, and uploaded configs.

The service never opens a path a client names.  A model is asked for by *name*: a preset shipped by an installed
plugin, or an entry of the ``--models-dir`` given at start-up (a sub-directory holding a ``config.json``, or a
``NAME.json`` file), listed once when the service starts.  An uploaded ``config.json`` is a JSON object in the
request: it is parsed with the CLI's bounds (:func:`kvpools_core.models.parse_config`, the same
:class:`~kvpools_core.config.ConfigReader` limits), then written under a private directory the service created at
start-up, named by its content hash, so that every kvpools function (which takes a model by name or path, and
estimates weights from the file) reads it as the CLI would read the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpools_core.config import MAX_CONFIG_BYTES
from kvpools_core.errors import ConfigError, short_repr
from kvpools_core.models import parse_config, registry_presets
from kvpools_core.registry import Registry

UPLOAD_PREFIX = "uploaded-"
"""The name of an uploaded config's entry: ``uploaded-<12 hex digits of its SHA-256>``."""


class Catalog:
    """Model names → the path kvpools reads for each, fixed at start-up (plus uploads, which the service writes)."""

    def __init__(self, registry: Registry, models_dir: str | os.PathLike[str] | None, max_uploads: int = 256) -> None:
        self.registry = registry
        self.presets: dict[str, str] = {name: path for name, (_, path) in registry_presets(registry).items()}
        self.local: dict[str, str] = _scan(Path(models_dir), self.presets) if models_dir is not None else {}
        self.models_dir = str(Path(models_dir).resolve()) if models_dir is not None else None
        self.upload_dir = tempfile.mkdtemp(prefix="kvpools-serve-")
        self.max_uploads = max_uploads
        self._uploads: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def names(self) -> dict[str, str]:
        """Every model a request may name, and where it comes from (``preset`` or ``models-dir``)."""
        return {**dict.fromkeys(sorted(self.presets), "preset"), **dict.fromkeys(sorted(self.local), "models-dir")}

    def resolve(self, name: str) -> str:
        """The model argument kvpools' functions take for ``name``: a preset's name, or a models-dir entry's path."""
        if name in self.presets:
            return name
        if name in self.local:
            return self.local[name]
        with self._lock:
            if name in self._uploads:
                self._uploads.move_to_end(name)
                return self._uploads[name]
        known = ", ".join(sorted(self.presets) + sorted(self.local))
        where = f" or an entry of --models-dir {self.models_dir}" if self.models_dir else ""
        raise ConfigError(
            f"Unknown model {short_repr(name)}: the service plans a preset{where}, or a config.json sent as "
            f'"config" (it opens no path a request names). Models: {known}.'
        )

    def upload(self, config: Mapping[str, Any]) -> str:
        """Check an uploaded config as the CLI checks a file, keep it under the upload directory; its path."""
        text = json.dumps(config, sort_keys=True)
        if len(text.encode()) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"The uploaded config is {len(text.encode()):,} bytes; a config.json is kilobytes (kvpools reads at "
                f"most {MAX_CONFIG_BYTES:,})."
            )
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        name = f"{UPLOAD_PREFIX}{digest}"
        parse_config(config, f"uploaded config.json ({name})", self.registry)  # the CLI's bounds, before any write
        folder = Path(self.upload_dir) / name
        path = folder / "config.json"
        with self._lock:
            if name not in self._uploads:
                folder.mkdir(exist_ok=True)
                scratch = folder / f".config.{threading.get_ident()}.tmp"
                scratch.write_text(text, encoding="utf-8")
                scratch.replace(path)  # whole or absent, for a concurrent reader of the same upload
                self._uploads[name] = str(path)
                while len(self._uploads) > self.max_uploads:
                    old, _ = self._uploads.popitem(last=False)
                    shutil.rmtree(Path(self.upload_dir) / old, ignore_errors=True)
            else:
                self._uploads.move_to_end(name)
        return str(path)

    def scrub(self, text: str) -> str:
        """Server paths out of a message or a response: uploads by their entry name, models-dir entries by theirs."""
        text = text.replace(self.upload_dir + os.sep, "")
        if self.models_dir is not None:
            text = text.replace(self.models_dir + os.sep, "")
        return text

    def close(self) -> None:
        shutil.rmtree(self.upload_dir, ignore_errors=True)


def _scan(folder: Path, presets: Mapping[str, str]) -> dict[str, str]:
    """``--models-dir``'s entries: ``NAME/config.json`` or ``NAME.json``; a name a preset has is refused."""
    if not folder.is_dir():
        raise ConfigError(f"--models-dir {folder}: not a directory. Pass a directory of model configs.")
    found: dict[str, str] = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and (entry / "config.json").is_file():
            found[entry.name] = str((entry / "config.json").resolve())
        elif entry.is_file() and entry.suffix == ".json":
            found[entry.stem] = str(entry.resolve())
    clash = sorted(set(found) & set(presets))
    if clash:
        raise ConfigError(
            f"--models-dir {folder}: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} also a preset's name; "
            f"rename the entry so a request's model name means one model."
        )
    return found
