#!/usr/bin/env python3
"""Writes fixtures/corpus/train.txt: the help topics of the Python documentation
(CPython's Lib/pydoc_data/topics.py, PSF License 2.0), in sorted topic order.

The text ships with every CPython install (Debian: libpython3.11-stdlib), so it can be
regenerated offline. Held-out text is the tail of the file (the trainer holds out the
last sequences)."""
import pathlib
import sys

from pydoc_data.topics import topics

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures/corpus/train.txt")
text = "\n\n".join(topics[k].strip() + "\n" for k in sorted(topics))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(text, encoding="utf-8")
print(f"{out}: {len(text.encode())} bytes from {len(topics)} topics ({sys.version.split()[0]})")
