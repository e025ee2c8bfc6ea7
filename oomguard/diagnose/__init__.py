"""`oomguard diagnose`: root cause and fix, with numbers, from a log, a traceback or a live /metrics endpoint."""

from oomguard.diagnose.model import LOG_CLASSES, METRIC_CLASSES, Diagnosis, Finding, Fix
from oomguard.diagnose.pipeline import diagnose_sources, diagnose_text

__all__ = ["LOG_CLASSES", "METRIC_CLASSES", "Diagnosis", "Finding", "Fix", "diagnose_sources", "diagnose_text"]
