"""User errors: everything the trainer and the command-line tools report as one `error: ...` line
and exit status 2. Each package owns its own error class; this module only gathers them."""

from __future__ import annotations

from data.data_errors import DataError
from evals.eval_config import EvalConfigError
from evals.task_data import EvalDataError
from models.hf_mapping import ExportError
from models.presets import ModelConfigError
from orscale.errors import OptimConfigError


class UserError(ValueError):
    """A user error found by the launcher (setup, run directory, launch): one line, exit 2."""


class ConfigError(UserError):
    """A user error in the configuration: the message is one line naming key and fix."""


# Raised by a section's own checks: while a config is being loaded they are config errors.
SECTION_ERRORS: tuple[type[ValueError], ...] = (DataError, ModelConfigError, OptimConfigError, EvalConfigError)
# The launcher's own errors and those of the sections' owners.
USER_ERRORS: tuple[type[ValueError], ...] = (UserError, *SECTION_ERRORS, ExportError, EvalDataError)
