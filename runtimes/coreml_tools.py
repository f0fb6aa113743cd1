"""coremltools for the coreml format's exporter and runtimes: imported quietly, or a ConfigError saying what to install."""

from __future__ import annotations

import warnings

from edge_spec.contract.formats import FORMATS
from edge_spec.errors import ConfigError
from edge_spec.logs import IMPORT_NOISE, quiet


def import_coremltools():
    """coremltools, imported without its import-time warnings (an untested torch version, no Core ML framework off
    macOS: neither is the user's business), or a ConfigError saying what to install."""
    try:
        with quiet("coremltools", *IMPORT_NOISE), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import coremltools
    except ImportError as err:
        raise ConfigError(f"the coreml format needs coremltools ({err.name or err})", FORMATS["coreml"].install) from err
    return coremltools
